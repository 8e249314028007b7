"""``cpu``: plain PyTorch on the CPU (the chip is irrelevant)."""

from __future__ import annotations

from typing import Any

from sandbox.targets.base import ScriptSetup, Target, TargetSpec


def resolve(**_: Any) -> Target:
    return Target("cpu", "cpu", reason="requested")


SPEC = TargetSpec(name="cpu", summary="plain PyTorch on the CPU", npu_like=False, resolve=resolve,
                  compile_backend="inductor", script=ScriptSetup(device="cpu"))
