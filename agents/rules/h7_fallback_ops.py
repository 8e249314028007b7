"""H7: ops that fall back to the CPU on Ascend (a static hint; the op matrix and the run's op report are the truth).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.models import Frame, StructuredException
from agents.rules.base import (
    MEDIUM,
    SLOWS,
    ErrorPattern,
    HazardRule,
    Signature,
)
from agents.rules.context import ModuleContext

# H7: ops that commonly have no NPU kernel and run on the CPU (or AICPU). A static hint only:
# the op matrix of the chosen torch_npu and the emulator's run-time report are the truth.
FALLBACK_OPS: dict[str, str] = {
    "isneginf": "the functional form has no NPU kernel in common torch_npu builds",
    "isposinf": "the functional form has no NPU kernel in common torch_npu builds",
    "sinc": "the NPU kernel hands the work to the CPU",
    "cummax": "no NPU kernel", "cummin": "no NPU kernel", "logcumsumexp": "no NPU kernel",
    "lgamma": "no NPU kernel", "digamma": "no NPU kernel", "polygamma": "no NPU kernel",
    "mode": "no NPU kernel", "hypot": "no NPU kernel", "nextafter": "no NPU kernel",
    "heaviside": "no NPU kernel", "frexp": "no NPU kernel", "i0": "no NPU kernel",
    "igamma": "no NPU kernel", "igammac": "no NPU kernel",
    "linalg.eigh": "decompositions run on the CPU/AICPU", "linalg.eigvalsh": "decompositions run on the CPU/AICPU",
    "linalg.det": "decompositions run on the CPU/AICPU", "linalg.slogdet": "decompositions run on the CPU/AICPU",
    "linalg.inv": "decompositions run on the CPU/AICPU", "linalg.cholesky": "decompositions run on the CPU/AICPU",
    "linalg.lu_factor": "decompositions run on the CPU/AICPU",
}
FALLBACK_METHODS = {k for k in FALLBACK_OPS if "." not in k}


# --- detector ----------------------------------------------------------------------------------

def _h7_fallback_ops(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        f = call.func
        q = ctx.qual(f)
        op: str | None = None
        if q.startswith("torch.") and q.removeprefix("torch.") in FALLBACK_OPS:
            op = q.removeprefix("torch.")
        elif isinstance(f, cst.Attribute) and f.attr.value in FALLBACK_METHODS and not ctx.is_module_ref(f.value):
            op = f.attr.value
        if op is not None:
            ctx.add("H7", "cpu-fallback-op", call,
                    f"`{op}`: {FALLBACK_OPS[op]}, so it runs on the CPU with a device round trip (the run-time "
                    "op report confirms it for the chosen torch_npu)", SLOWS, MEDIUM)


_FALLBACK_OP = re.compile(r"The operator '([\w:.]+)' would execute its main computation on CPU")


def _fallback_disabled(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    if (fm := _FALLBACK_OP.search(exc.message)) or "TORCH_NPU_FALLBACK_CPU_DISABLE" in exc.message:
        op = fm.group(1) if fm else "unknown"
        return Signature("npu-fallback-disabled", f"npu-fallback-disabled:{op}@{where}",
                         f"{op} has no NPU kernel and CPU fallback is disabled", frame)
    return None


RULE = HazardRule(
    hazard="H7",
    title="Ops that fall back to the CPU on Ascend",
    detect=_h7_fallback_ops,
    manual={"cpu-fallback-op": "an exact rewrite with supported ops depends on the op and its numerics"},
    explains=(ErrorPattern("npu-fallback-disabled", _fallback_disabled, "ops that fall back to the CPU",
                           needs_frame=False, order=40),),
    kb_topic="recipe:H7",
    recipe="knowledge/recipes/H7.md",
    left_as_written="falls back to the CPU on this torch_npu build; correct but slow",
    fixtures=("tests/test_scanner.py", "examples/ocr_mini"),
)
