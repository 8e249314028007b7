"""ascend-sim: an emulated Ascend (torch_npu) host on the CPU. See docs/ascend-sim.md."""

from __future__ import annotations

import os
from typing import Any

from . import device as _device
from . import npu_api as _npu_api
from .device import NpuTensor
from .policy import BUILTIN_FALLBACKS, COMPLEX_DTYPES, Policy
from .profiles import PROFILES, ChipProfile, get_profile
from .runtime import RT

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

    options: {"chip": "910b"|"a3"|"310p", "torch_npu": "2.13.0", "matrix_path": str|None, "strict": bool,
    "engine": "auto"|"native"|"python", "native_lib": path of the built native engine,
    "engine_note": why that engine, "matrix_note": why not the recorded matrix}.
    Calling it again reconfigures (chip, matrix, strict) and resets the counters; the engine stays.
    """
    import torch

    opts = dict(options or {})
    profile = get_profile(str(opts.get("chip") or "910b"))
    version = str(opts.get("torch_npu") or "2.13.0")
    strict = bool(opts.get("strict")) or os.environ.get("TORCH_NPU_FALLBACK_CPU_DISABLE") == "1"
    engine, lib, why = _engine_for(opts)
    RT.profile = profile
    RT.policy = Policy.load(opts.get("matrix_path"), allow_bf16=profile.bf16)
    RT.strict = strict
    RT.forget_decisions()
    RT.bad = COMPLEX_DTYPES if profile.bf16 else COMPLEX_DTYPES | {torch.bfloat16}
    RT.rec = RT.new_recorder()
    npu_mod, _ = _npu_api.install_modules(version)
    if engine == "native":
        from . import native_engine

        RT.engine = native_engine.install(str(lib), npu_mod)
    else:
        _device.set_bad_dtypes(RT.bad)
        _device.register(npu_mod)
        RT.engine = _device.ENGINE
    _OPTIONS.clear()
    _OPTIONS.update({"chip": profile.key, "torch_npu": version, "strict": strict, "engine": engine,
                     "engine_note": why, "matrix_note": opts.get("matrix_note")})


def _engine_for(opts: dict[str, Any]) -> tuple[str, str | None, str]:
    """The engine this process runs; once chosen it cannot change (torch's PrivateUse1 is global)."""
    current = getattr(RT, "engine", None)
    requested = str(opts.get("engine") or _engine_setting())
    if current is not None:
        if requested not in ("auto", current.name):
            raise RuntimeError(f"ascend-sim already runs the {current.name} engine in this process")
        return current.name, opts.get("native_lib"), str(_OPTIONS.get("engine_note", ""))
    note = opts.get("engine_note")  # the parent's reason, when a target chose the engine
    if requested == "native" and opts.get("native_lib"):
        return "native", str(opts["native_lib"]), str(note or "native engine (C++ PrivateUse1 backend)")
    if requested == "python" and note:
        return "python", None, str(note)
    from .native_build import choose_engine

    return choose_engine(requested)


def _engine_setting() -> str:
    """NPUPORT_SIM_ENGINE, for an install() whose options name no engine (a test, the bundle's run.py). A
    sandboxed run never asks: its target resolved the engine in the parent (sandbox/targets/ascend_sim.py)
    and passes it in the options, so the harness process needs no settings (nor pydantic)."""
    from knowledge.settings import settings

    return settings().sim_engine or "auto"


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
        "engine": _OPTIONS["engine"],
        "engine_note": _OPTIONS["engine_note"],
    }
    if _OPTIONS.get("matrix_note"):  # a bundle's recorded matrix missing here (sandbox/targets/ascend_sim.py)
        report["matrix_note"] = _OPTIONS["matrix_note"]
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
