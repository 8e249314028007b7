"""``npu``: a real Ascend NPU through torch_npu."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from sandbox.targets.base import ScriptSetup, Target, TargetSpec


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


def resolve(*, strict: bool = False, **_: Any) -> Target:
    env = {"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"} if strict else {}
    return Target("npu", "npu:0", "sandbox.targets.npu_runtime:install", {"strict": strict}, env, reason="requested")


SPEC = TargetSpec(name="npu", summary="a real Ascend NPU through torch_npu", npu_like=True, resolve=resolve,
                  uses_matrix=False, needs_device=True, probe=probe_npu, compile_backend="torchair", graph_capture=True,
                  script=ScriptSetup(device="npu:0", imports=("torch_npu",)))
