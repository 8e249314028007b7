"""H20: a KV cache passed as legacy tuples (``past_key_value[0]``, ``present = (k, v)``): transformers 4.36+
hands attention layers a ``Cache`` object (5.x only that), so tuple indexing meets an object it does not
fit, and vLLM-Ascend's paged cache cannot take the model's own tuples at all.

One hazard class, one module: detector, the reason it is left to a person, its knowledge-base topic (see
docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.rules.base import BLOCKS, MEDIUM, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes

# Names a layer's cache goes by in remote code (past_key_value, layer_past, past, kv_cache, ...).
PAST_NAME = re.compile(r"^(past_key_values?|layer_past|past|kv_cache|past_kv|cache_kv|layer_cache)$")
PRESENT_NAME = re.compile(r"^(present|presents|present_key_value|past_key_value|layer_past|next_cache|new_cache)$")


def _name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


def _int_index(sub: cst.Subscript) -> int | None:
    if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
        return None
    value = sub.slice[0].slice.value
    return int(value.value) if isinstance(value, cst.Integer) else None


def _detect(ctx: ModuleContext) -> None:
    seen: set[int] = set()  # one finding per function: a layer reads the tuple several times

    def add(node: cst.CSTNode, message: str) -> None:
        fn = ctx.function_of(node)
        key = id(fn) if fn is not None else -ctx.pos(node)[0]
        if key not in seen:
            seen.add(key)
            ctx.add("H20", "legacy-tuple-cache", node, message, BLOCKS, MEDIUM)

    for node in walk_nodes(ctx.module):
        if isinstance(node, cst.Subscript) and PAST_NAME.match(_name(node.value)) and _int_index(node) in (0, 1):
            add(node, f"`{ctx.code(node).strip()}` reads the KV cache as a (key, value) tuple: transformers 4.36+ "
                      "passes a Cache object (5.x only that), and a paged serving cache (vLLM-Ascend) is not the "
                      "model's tuple; the cache layout is tied to the transformers release the code was written for")
        elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Tuple) and len(node.value.elements) == 2 \
                and any(PRESENT_NAME.match(_name(t.target)) for t in node.targets):
            add(node, f"`{ctx.code(node).strip()[:80]}` builds the layer's KV cache as a (key, value) tuple: "
                      "transformers 4.36+ expects the layer to update a Cache object, and 5.x no longer converts "
                      "tuples back")


RULE = HazardRule(
    hazard="H20",
    title="KV cache passed as legacy (key, value) tuples",
    detect=_detect,
    manual={
        "legacy-tuple-cache": "moving a model to the Cache API changes every attention layer's signature and "
                              "its generate(); the environment of the model's era (its transformers pin) runs "
                              "it as written, and serving needs the model's vLLM-Ascend implementation",
    },
    report_only=True,
    kb_topic="recipe:H20",
    left_as_written="the cache layout is the model's API with its transformers release; the era's environment runs it",
    fixtures=("tests/test_scan_classes.py",),
)
