"""H22: MoE routing computed on int64 indices (``topk`` indices, ``one_hot``, ``bincount``, ``argsort``,
``.long()`` of expert ids): torch_npu's fused routing kernels (npu_moe_gating_top_k_softmax,
npu_moe_init_routing) take int32 expert and row indices, and int64 index arithmetic is the slow path on
Ascend's vector units; a routing written on int64 cannot be handed to them as is.

One hazard class, one module: detector, the reason it is left to a person, its knowledge-base topic (see
docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.rules.base import LOW, SLOWS, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import kwarg, last_name

ROUTING = frozenset({"gate", "gating", "router", "route", "routing", "moe", "expert", "experts", "dispatch",
                     "combine", "topk"})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
INDEX_OPS = frozenset({"one_hot", "bincount", "argsort", "histc", "scatter_add", "scatter_add_", "index_add",
                       "index_add_", "unique", "searchsorted"})
INT64 = frozenset({"torch.int64", "torch.long"})


def _words(name: str) -> set[str]:
    """The words of a snake_case or CamelCase name, lower case: MoEGate -> {moe, gate}."""
    words = {w.lower() for part in name.split("_") for w in _WORD.findall(part)}
    return words | {w for w in ("moe", "topk") if w in name.lower()}  # MoE, TopK: capitals inside a word


def _routing_scope(ctx: ModuleContext, node: cst.CSTNode) -> str | None:
    """The enclosing routing function or class (by name), else None."""
    for a, _ in ctx.ancestors(node):
        if isinstance(a, cst.FunctionDef | cst.ClassDef) and ROUTING & _words(a.name.value):
            return a.name.value
    return None


def _int64_cast(ctx: ModuleContext, call: cst.Call) -> bool:
    name = last_name(call.func)
    if name == "long" and not call.args:
        return True
    if name == "to" and call.args and ctx.qual(call.args[0].value) in INT64:
        return True
    dtype = kwarg(call, "dtype")
    return dtype is not None and ctx.qual(dtype.value) in INT64 and name in ("to", "zeros", "ones", "arange", "empty",
                                                                             "full", "tensor", "zeros_like")


def _detect(ctx: ModuleContext) -> None:
    seen: set[str] = set()
    for call in ctx.ix.calls:
        scope = _routing_scope(ctx, call)
        if scope is None:
            continue
        name = last_name(call.func)
        what = (f"`{name}` over expert indices" if name in INDEX_OPS
                else "an int64 cast of routing indices" if _int64_cast(ctx, call) else None)
        if what is None or f"{scope}:{name}" in seen:
            continue
        seen.add(f"{scope}:{name}")
        ctx.add("H22", "int64-routing", call,
                f"`{scope}` routes tokens with {what} (`{ctx.code(call).strip()[:70]}`): the indices are int64, "
                "while torch_npu's fused MoE routing (npu_moe_gating_top_k_softmax, npu_moe_init_routing) takes "
                "int32 expert/row indices and int64 index arithmetic is the slow path on Ascend", SLOWS, LOW)


RULE = HazardRule(
    hazard="H22",
    title="MoE routing on int64 indices",
    detect=_detect,
    manual={
        "int64-routing": "int32 routing indices change the dtypes the routing hands to the experts (and int32 "
                         "bounds); moving to the fused routing kernels is a rewrite of the routing, measured on "
                         "the NPU",
    },
    report_only=True,
    kb_topic="recipe:H22",
    left_as_written="int64 routing computes the same experts; int32 fused routing is a performance rewrite",
    fixtures=("tests/test_scan_classes.py",),
)
