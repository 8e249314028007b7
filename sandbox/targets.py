"""Targets: where a port runs. Isolation (sandbox/process.py) is chosen independently.

- ``cpu``: plain PyTorch on the CPU.
- ``ascend-sim``: the emulated Ascend runtime (sandbox/ascend_sim) on the CPU, for a chosen
  torch_npu version and chip, with the op-support matrix of that build.
- ``npu``: a real Ascend NPU through torch_npu.
- ``auto``: ``npu`` when torch_npu imports and sees a device, else ``ascend-sim``; says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from knowledge.errors import TargetError  # noqa: F401  (re-exported)

TARGET_NAMES = ("cpu", "ascend-sim", "npu", "auto")
CHIPS = ("910b", "a3", "310p")


@dataclass(frozen=True)
class Target:
    name: str
    device: str  # device string the port runs on
    bootstrap: str | None = None  # "module:function" the harness calls before importing the model
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    reason: str = ""  # why this target (for auto)

    def harness_target(self) -> dict[str, Any]:
        return {"name": self.name, "bootstrap": self.bootstrap, "options": dict(self.options)}

    @property
    def is_npu_like(self) -> bool:
        return self.name in ("ascend-sim", "npu")


def probe_npu(timeout_s: float = 60.0) -> tuple[bool, str]:
    """Does torch_npu import here and see a device? Probed in a child process: a torch_npu without CANN
    can break ``import torch`` itself, which must not take npuport down."""
    code = (
        "import torch, torch_npu\n"
        "n = torch.npu.device_count() if torch.npu.is_available() else 0\n"
        "print(n)\n"
    )
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # import torch_npu explicitly, report its own error
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return False, "probing torch_npu timed out"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["unknown error"])[-1]
        return False, f"torch_npu cannot be imported here ({last})"
    n = int((r.stdout.strip() or "0").splitlines()[-1])
    if n <= 0:
        return False, "torch_npu imports but sees no NPU device"
    return True, f"torch_npu imports and sees {n} NPU device(s)"


def resolve_target(
    name: str,
    *,
    chip: str = "910b",
    torch_npu: str = "2.13.0",
    strict: bool = False,
    matrix_path: str | None = None,
) -> Target:
    if name not in TARGET_NAMES:
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(TARGET_NAMES)}")
    if chip not in CHIPS:
        raise TargetError(f"unknown chip {chip!r}; choose one of {', '.join(CHIPS)}")
    if name == "auto":
        ok, why = probe_npu()
        if ok:
            t = resolve_target("npu", chip=chip, torch_npu=torch_npu, strict=strict)
            return Target(t.name, t.device, t.bootstrap, t.options, t.env, reason=f"auto: {why}")
        t = resolve_target("ascend-sim", chip=chip, torch_npu=torch_npu, strict=strict, matrix_path=matrix_path)
        return Target(t.name, t.device, t.bootstrap, t.options, t.env, reason=f"auto: {why}; using the emulator")
    if name == "cpu":
        return Target("cpu", "cpu", reason="requested")
    if name == "npu":
        env = {"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"} if strict else {}
        return Target("npu", "npu:0", "sandbox.npu_runtime:install", {"strict": strict}, env, reason="requested")
    from knowledge.settings import settings
    from sandbox.ascend_sim.native_build import NativeUnavailable, choose_engine

    try:
        engine, lib, why = choose_engine(settings().sim_engine or "auto", log=_log)
    except (NativeUnavailable, ValueError) as e:
        raise TargetError(f"ascend-sim: {e}") from e
    options = {"chip": chip, "torch_npu": torch_npu, "matrix_path": matrix_path, "strict": strict,
               "engine": engine, "native_lib": lib, "engine_note": why}
    env = {"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"} if strict else {}
    return Target("ascend-sim", "npu", "sandbox.ascend_sim:install", options, env, reason=f"requested; {why}")


def _log(msg: str) -> None:
    print(f"npuport: {msg}", file=sys.stderr, flush=True)
