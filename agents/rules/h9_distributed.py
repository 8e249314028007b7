"""H9: distributed backend (nccl -> hccl, NCCL_* settings).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from agents.models import Finding
from agents.rules.base import (
    BLOCKS,
    HIGH,
    LOW,
    SLOWS,
    Fix,
    HazardRule,
)
from agents.rules.context import ModuleContext, TextFile
from agents.rules.cst_helpers import (
    kwarg,
    positional,
    string_value,
)
from agents.rules.kit import (
    CodemodResult,
    Rewriter,
    run_codemod,
)

COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "new_group", "send", "recv",
               "isend", "irecv", "gather", "scatter"}


# --- detector ----------------------------------------------------------------------------------

def _h9_distributed(ctx: ModuleContext) -> None:
    for s in ctx.ix.strings:
        value = string_value(s) or ""
        if value == "nccl" or re.fullmatch(r"(\w+:\w+,)*cuda:nccl(,\w+:\w+)*", value):
            ctx.add("H9", "nccl-backend", s,
                    "the nccl backend needs NVIDIA GPUs; Ascend's collective backend is hccl", BLOCKS, HIGH)
        elif re.fullmatch(r"NCCL_[A-Z0-9_]+", value):
            ctx.add("H9", "nccl-env", s,
                    f"{value} configures NCCL only; it does nothing on Ascend (HCCL_* variables instead)",
                    SLOWS, LOW)
    for ref in ctx.refs:
        if ref.qual.startswith("torch.cuda.nccl") or ref.qual.endswith("is_nccl_available"):
            ctx.add("H9", "nccl-api", ref.node,
                    f"`{ref.qual}` is NCCL-specific; Ascend uses HCCL through torch.distributed", BLOCKS, HIGH)
    for call in ctx.ix.calls:
        q = ctx.qual(call.func)
        if q.startswith("torch.distributed.") and q.rsplit(".", 1)[-1] in COLLECTIVES:
            ctx.add("H9", "collective-call", call,
                    f"`{q.removeprefix('torch.')}` runs on the process group's backend: on Ascend the group must be "
                    "hccl and the tensor on the NPU; validation runs a single-process world of size 1", BLOCKS, LOW)
        if q.endswith("init_process_group") and positional(call, 0) is None and kwarg(call, "backend") is None:
            ctx.add("H9", "process-group-init", call,
                    "init_process_group without a backend picks one by device: on Ascend import torch_npu first "
                    "so hccl is registered, or pass backend=\"hccl\"", BLOCKS, LOW)


# --- fix ---------------------------------------------------------------------------------------

DIST_HELPER = '''
def _npuport_dist_backend():
    """hccl where torch_npu drives Ascend NPUs; nccl exists only for NVIDIA GPUs (hazard H9)."""
    return "hccl" if hasattr(torch, "npu") and torch.npu.is_available() else "gloo"
'''


class NcclToHccl(Rewriter):
    """H9: process groups on "nccl" -> hccl on Ascend (gloo on the CPU)."""

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.BaseExpression:
        if updated.evaluated_value == "nccl":
            self.note(original, '"nccl" -> _npuport_dist_backend()')
            return cst.parse_expression("_npuport_dist_backend()")
        return updated


def nccl_to_hccl(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: NcclToHccl(), [(DIST_HELPER, "def _npuport_dist_backend(")])


def _h9_text(tf: TextFile) -> list[Finding]:
    out: list[Finding] = []
    for ln in tf.env_lines():
        m = re.search(r"\bNCCL_[A-Z_]+\s*=", ln.line)
        if m:
            out.append(tf.finding("H9", "nccl-env", ln.lineno, m.start(), ln.snippet,
                                  "NCCL_* settings do nothing on Ascend, whose collectives use HCCL (HCCL_* "
                                  "variables)", SLOWS, LOW))
    return out


RULE = HazardRule(
    hazard="H9",
    title="Distributed backend (nccl -> hccl)",
    detect=_h9_distributed,
    detect_text=_h9_text,
    fixes=(Fix("nccl-to-hccl", nccl_to_hccl, "distributed backend hccl (Ascend) instead of nccl",
               frozenset({"nccl-backend"}), order=50),),
    manual={
        "nccl-env": "the HCCL_* equivalents are tuning choices",
        "nccl-api": "NCCL-specific calls need a torch.distributed rewrite",
        "collective-call": "a collective is correct on hccl once the group's backend is (nccl-to-hccl fixes that); "
                           "its cost across devices needs a person's look",
        "process-group-init": "importing torch_npu registers hccl; passing the backend is the caller's choice",
    },
    kb_topic="recipe:H9",
    fixtures=("tests/test_scanner.py", "tests/test_codemods.py", "tests/test_cast_world_fallback.py"),
)
