"""H21: a KV cache grown by ``torch.cat`` each decode step (``torch.cat([past_key_value[0], k], dim=2)``):
every step allocates a new cache and copies the whole history, so decoding costs O(n^2) copies, and the
shape changes each step, so an NPU graph (torchair / aclgraph) recompiles per token instead of replaying.

One hazard class, one module: detector, the reason it is left to a person, its knowledge-base topic (see
docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.rules.base import LOW, SLOWS, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes

CACHE_NAME = re.compile(r"(^|_)(past|cache|cached)(_|$)|^past_key_values?$", re.I)
# The new step's part is a key or a value (``key_states``, ``k``, ``value_layer``), not a mask or positions.
KV_NAME = re.compile(r"key|value|^(k|v|kv|xk|xv)(_\w+)?$", re.I)


def _mentions(node: cst.CSTNode, pattern: re.Pattern[str]) -> bool:
    for n in walk_nodes(node):
        name = n.value if isinstance(n, cst.Name) else n.attr.value if isinstance(n, cst.Attribute) else ""
        if name and pattern.search(name):
            return True
    return False


def _detect(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        if ctx.qual(call.func) not in ("torch.cat", "torch.concat", "torch.concatenate") or not call.args:
            continue
        first = call.args[0].value
        if not isinstance(first, cst.List | cst.Tuple) or len(first.elements) < 2:
            continue
        old, new = first.elements[0].value, first.elements[-1].value
        if _mentions(old, CACHE_NAME) and not _mentions(new, CACHE_NAME) and _mentions(new, KV_NAME):
            ctx.add("H21", "kv-cat-growth", call,
                    f"`{ctx.code(call).strip()[:90]}` grows the KV cache by concatenation each step: a new cache "
                    "and a copy of the whole history per token (O(n^2) copies over a decode), and a shape that "
                    "changes per step, so NPU graph modes recompile instead of replaying; a preallocated cache "
                    "written in place (index_copy_ / a StaticCache) keeps one shape", SLOWS, LOW)


RULE = HazardRule(
    hazard="H21",
    title="KV cache grown by torch.cat each decode step",
    detect=_detect,
    manual={
        "kv-cat-growth": "a preallocated cache changes the layer's cache API and its generate() (max length, "
                         "positions, masks); it is a design change of the model, measured by the tuner's decode "
                         "profile",
    },
    report_only=True,
    kb_topic="recipe:H21",
    left_as_written="growing the cache by concatenation is correct, only slow; a static cache is a design change",
    fixtures=("tests/test_scan_classes.py",),
)
