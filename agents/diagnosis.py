"""Diagnosis skills: a failed run's structured exception as a failure signature, and the port's budget.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from agents.cuda_only import CUDA_ONLY
from agents.models import Frame, StructuredException

# One list of CUDA-only libraries for the agents: the one the import codemod guards.
CUDA_ONLY_ROOTS = CUDA_ONLY


_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


_DT_LIST = re.compile(r"not implemented for (DT_\w+)")


_FALLBACK_OP = re.compile(r"The operator '([\w:.]+)' would execute its main computation on CPU")


@dataclass(frozen=True)
class Signature:
    kind: str
    key: str  # the signature string: kind plus what identifies this failure
    summary: str
    frame: Frame | None


def innermost_model_frame(exc: StructuredException) -> Frame | None:
    for f in reversed(exc.frames):
        if f.in_model:
            return f
    return None


def classify(exc: StructuredException) -> Signature:
    """Map an exception to a stable failure signature."""
    frame = innermost_model_frame(exc)
    where = f"{frame.file}:{frame.line}" if frame else "outside the model"
    msg = exc.message
    if exc.type in ("ModuleNotFoundError", "ImportError") and (mm := _MISSING_MODULE.search(msg)):
        root = mm.group(1).split(".")[0]
        kind = "missing-cuda-module" if root in CUDA_ONLY_ROOTS else "missing-module"
        return Signature(kind, f"{kind}:{root}@{where}", f"the model imports {mm.group(1)}, which is not installed here "
                         + ("(a CUDA-only library)" if kind == "missing-cuda-module" else ""), frame)
    if "Torch not compiled with CUDA enabled" in msg or "Found no NVIDIA driver" in msg:
        return Signature("cuda-assert", f"cuda-assert@{where}", f"CUDA is called at {where}, and this host has none", frame)
    if "Expected all tensors to be on the same device" in msg:
        return Signature("device-mismatch", f"device-mismatch@{where}", f"tensors on different devices meet at {where}", frame)
    if (fm := _FALLBACK_OP.search(msg)) or "TORCH_NPU_FALLBACK_CPU_DISABLE" in msg:
        op = fm.group(1) if fm else "unknown"
        return Signature("npu-fallback-disabled", f"npu-fallback-disabled:{op}@{where}",
                         f"{op} has no NPU kernel and CPU fallback is disabled", frame)
    if "EZ1001" in msg or "should be in dtype support list" in msg:
        dt = (_DT_LIST.search(msg) or re.search(r"(DT_\w+)", msg))
        dtype = dt.group(1) if dt else "unknown"
        return Signature("npu-dtype", f"npu-dtype:{dtype}@{where}", f"an NPU kernel rejects {dtype} at {where}", frame)
    if exc.type == "Timeout":
        return Signature("timeout", "timeout", exc.message, frame)
    if exc.type in ("OutOfMemoryError",) or "out of memory" in msg.lower():
        return Signature("oom", f"oom@{where}", f"out of memory at {where}", frame)
    if exc.type == "ProcessDied":
        return Signature("crash", "crash", exc.message, frame)
    if exc.type in ("RuntimeError", "ValueError") and re.search(r"size|shape|dimension", msg):
        return Signature("shape-mismatch", f"shape-mismatch@{where}", f"a shape mismatch at {where}: {msg[:160]}", frame)
    return Signature("exception", f"exception:{exc.type}@{where}", f"{exc.type} at {where}: {msg[:200]}", frame)


def budget_left(state: dict[str, Any]) -> tuple[bool, str]:
    """(True, "") while the run may continue, else (False, which budget ran out)."""
    req = state["request"]
    runs = (state.get("counters") or {}).get("port_runs", 0)
    if runs >= req.get("max_runs", 8):
        return False, f"the budget of {req.get('max_runs')} sandbox runs is spent"
    started = state.get("started_at") or time.time()
    if time.time() - started >= req.get("max_wall_s", 1800):
        return False, f"the wall-time budget of {req.get('max_wall_s'):g} s is spent"
    return True, ""
