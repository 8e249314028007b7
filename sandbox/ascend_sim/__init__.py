"""ascend-sim: an emulated Ascend (torch_npu) host on the CPU. See docs/ascend-sim.md."""

from __future__ import annotations

import os
from typing import Any

from . import device as _device
from . import npu_api as _npu_api
from .device import RT, NpuTensor
from .policy import BUILTIN_FALLBACKS, COMPLEX_DTYPES, Policy
from .profiles import PROFILES, ChipProfile, get_profile

__all__ = [
    "PROFILES",
    "ChipProfile",
    "NpuTensor",
    "begin_step",
    "end_step",
    "get_profile",
    "install",
    "op_report",
    "reset",
]

_OPTIONS: dict[str, Any] = {}


def install(options: dict[str, Any] | None = None) -> None:
    """Install the emulated npu device, torch.npu / torch_npu and the op guard in this process.

    options: {"chip": "910b"|"a3"|"310p", "torch_npu": "2.13.0", "matrix_path": str|None, "strict": bool}.
    Calling it again reconfigures (chip, matrix, strict) and resets the counters.
    """
    import torch

    opts = dict(options or {})
    profile = get_profile(str(opts.get("chip") or "910b"))
    version = str(opts.get("torch_npu") or "2.13.0")
    strict = bool(opts.get("strict")) or os.environ.get("TORCH_NPU_FALLBACK_CPU_DISABLE") == "1"
    RT.profile = profile
    RT.policy = Policy.load(opts.get("matrix_path"), allow_bf16=profile.bf16)
    RT.strict = strict
    RT.forget_decisions()
    _device.set_bad_dtypes(COMPLEX_DTYPES if profile.bf16 else COMPLEX_DTYPES | {torch.bfloat16})
    RT.rec = RT.new_recorder()
    npu_mod, _ = _npu_api.install_modules(version)
    _device.register(npu_mod)
    _OPTIONS.clear()
    _OPTIONS.update({"chip": profile.key, "torch_npu": version, "strict": strict})


def _require() -> None:
    if not _OPTIONS:
        raise RuntimeError("ascend-sim is not installed in this process; call install(options) first")


def op_report() -> dict[str, Any]:
    _require()
    body = RT.rec.report()
    builtin = RT.policy.builtin
    report: dict[str, Any] = {
        "target": "ascend-sim",
        "chip": _OPTIONS["chip"],
        "device_name": RT.profile.device_name,
        "torch_npu": _OPTIONS["torch_npu"],
        "matrix": "builtin" if builtin else RT.policy.source,
        "strict": _OPTIONS["strict"],
    }
    if builtin:
        report["matrix_note"] = (
            "no op-support matrix given: built-in minimal policy (every op has an NPU kernel except "
            + ", ".join(sorted(BUILTIN_FALLBACKS))
            + ")"
        )
    report.update(body)
    return report


def begin_step(label: str) -> None:
    _require()
    RT.rec.begin_step(label)


def end_step() -> None:
    _require()
    RT.rec.end_step()


def reset() -> None:
    """Clear the counters (and the once-only warnings), keeping the installed configuration."""
    _require()
    RT.zero_counts()
    RT.rec = RT.new_recorder()
