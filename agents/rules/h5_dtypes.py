"""H5: dtypes Ascend handles differently (float64, bfloat16 on 310P; complex tensors are H27).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from agents.models import Frame, StructuredException
from agents.rules.base import (
    BLOCKS,
    LOW,
    MEDIUM,
    NUMBERS,
    ErrorPattern,
    Fix,
    HazardRule,
    Signature,
)
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import (
    kwarg,
)
from agents.rules.kit import (
    CodemodResult,
    Rewriter,
    dotted_name,
    run_codemod,
)

# H5
FLOAT64_REFS = {"torch.float64", "torch.double"}
NP_FLOAT64_REFS = {"numpy.float64", "numpy.double"}


# --- detector ----------------------------------------------------------------------------------

def _h5_dtypes(ctx: ModuleContext) -> None:
    for ref in ctx.refs:
        q = ref.qual
        if q in FLOAT64_REFS:
            ctx.add("H5", "float64", ref.node,
                    f"`{q}`: the NPU has no float64 compute; casts silently become float32 and some kernels "
                    "reject double, so numbers differ from the reference or the op fails; use float32",
                    NUMBERS, MEDIUM)
        elif q in NP_FLOAT64_REFS and _feeds_torch(ctx, ref.node):
            ctx.add("H5", "float64", ref.node,
                    "numpy float64 flowing into a torch tensor makes it float64, which the NPU does not compute "
                    "(silently float32 or rejected); use float32", NUMBERS, MEDIUM)
        elif q == "torch.bfloat16":
            ctx.add("H5", "bf16-on-310p", ref.node,
                    "bfloat16 is fine on Atlas A2/A3 (910B/910C) but Atlas 300I (310P) has no bfloat16: use "
                    "float16 there", BLOCKS, LOW)
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "double" and not call.args \
                and not ctx.is_module_ref(f.value):
            ctx.add("H5", "float64", call,
                    "`.double()` makes a float64 tensor: the NPU has no float64 compute (silently float32 or "
                    "rejected); use .float()", NUMBERS, MEDIUM)
        dt = kwarg(call, "dtype")
        if dt is not None and isinstance(dt.value, cst.Name) and dt.value.value == "float" \
                and ctx.qual(f).startswith("torch."):
            ctx.add("H5", "float64", dt, "dtype=float means float64 in torch, which Ascend does not compute natively",
                    NUMBERS, MEDIUM)


def _feeds_torch(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """The numpy dtype sits in a statement that also builds a torch tensor."""
    for a, _ in ctx.ancestors(node):
        if isinstance(a, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            return bool(re.search(r"\btorch\.(from_numpy|tensor|as_tensor)|\bfrom_numpy\(", ctx.code(a)))
    return False


# --- fix ---------------------------------------------------------------------------------------

class Float64ToFloat32(Rewriter):
    """H5: float64 has no NPU kernels (torch_npu downcasts it with a warning); compute in float32."""

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if dotted_name(updated) in ("torch.float64", "torch.double"):
            self.note(original, f"{dotted_name(updated)} -> torch.float32")
            return cst.parse_expression("torch.float32")
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "double" and not updated.args:
            self.note(original, ".double() -> .float()")
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("float")))
        return updated


def float64_to_float32(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: Float64ToFloat32())


_DT_LIST = re.compile(r"not implemented for (DT_\w+)")


def _npu_dtype(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    msg = exc.message
    if "EZ1001" in msg or "should be in dtype support list" in msg:
        dt = (_DT_LIST.search(msg) or re.search(r"(DT_\w+)", msg))
        dtype = dt.group(1) if dt else "unknown"
        return Signature("npu-dtype", f"npu-dtype:{dtype}@{where}", f"an NPU kernel rejects {dtype} at {where}", frame)
    return None


RULE = HazardRule(
    hazard="H5",
    title="dtypes Ascend handles differently (float64, bf16 on 310P)",
    detect=_h5_dtypes,
    fixes=(Fix("float64-to-float32", float64_to_float32, "compute in float32 where the code asked for float64",
               frozenset({"float64"}), order=40),),
    manual={
        "bf16-on-310p": "only a problem on chips without bfloat16; the dtype is chosen per chip at deploy time",
    },
    explains=(ErrorPattern("npu-dtype", _npu_dtype, "float64 on the NPU", fix="float64-to-float32",
                           fix_if=lambda sig: "DT_DOUBLE" in sig.key, order=50),),
    kb_topic="recipe:H5",
    left_as_written="only an issue on chips without the dtype (bfloat16 on 310P) or for exact float64 numerics",
    fixtures=("tests/test_scanner.py", "tests/test_codemods.py", "examples/ocr_mini"),
)
