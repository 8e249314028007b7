"""``auto``: ``npu`` when torch_npu imports and sees a device, else ``ascend-sim``; says why."""

from __future__ import annotations

from typing import Any

from sandbox.targets import ascend_sim, npu
from sandbox.targets.base import Target, TargetSpec


def resolve(*, chip: str, torch_npu: str, strict: bool = False, matrix_path: str | None = None,
            **_: Any) -> Target:
    ok, why = npu.probe_npu()
    if ok:
        t = npu.resolve(chip=chip, torch_npu=torch_npu, strict=strict)
        return Target(t.name, t.device, t.bootstrap, t.options, t.env, reason=f"auto: {why}")
    t = ascend_sim.resolve(chip=chip, torch_npu=torch_npu, strict=strict, matrix_path=matrix_path)
    return Target(t.name, t.device, t.bootstrap, t.options, t.env, reason=f"auto: {why}; using the emulator")


SPEC = TargetSpec(name="auto", summary="npu when torch_npu sees a device, else ascend-sim", npu_like=True,
                  resolve=resolve, uses_matrix=True, chooser=True)
