"""H17: model sizes fixed in code, not read from the config (builder defaults, literal keyword sizes,
``nn.Embedding(144, d)``): ``--shrink`` reduces the sizes in config.json, so these parts keep their full size
on a small box, and a checkpoint with other sizes does not load into them.

One hazard class, one module: detector, the reason it is left to a person, its knowledge-base topic (see
docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.rules.base import LOW, SLOWS, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes

SIZE_NAME = re.compile(r"(^|_)(dim|dims|dimension|size|depth|layers?|heads|channels|chans|hidden|embed|width|"
                       r"query|queries|experts|intermediate)(_|$)", re.I)
NOT_A_SIZE = re.compile(r"kernel|stride|pad|window|ratio|eps|batch|position|seq|length|token|vocab|worker|seed|"
                        r"group|indexes|prompt", re.I)
_LAYERS = {"Embedding", "Linear", "Conv1d", "Conv2d", "Conv3d", "LayerNorm", "GroupNorm"}


def _size_literal(e: cst.BaseExpression | None) -> int | None:
    if isinstance(e, cst.Integer):
        value = int(e.value)
        return value if value >= 2 else None
    return None


def _sized(name: str) -> bool:
    return bool(SIZE_NAME.search(name)) and not NOT_A_SIZE.search(name)


def _h17_fixed_sizes(ctx: ModuleContext) -> None:
    for node in walk_nodes(ctx.module):
        if isinstance(node, cst.FunctionDef) and ctx.function_of(node) is None and \
                not isinstance(ctx.parent(ctx.parent(node) or node), cst.ClassDef):
            fixed = [(p.name.value, v) for p in node.params.params
                     if _sized(p.name.value) and (v := _size_literal(p.default)) is not None]
            if len(fixed) >= 2:
                shown = ", ".join(f"{n}={v}" for n, v in fixed)
                ctx.add("H17", "fixed-size-defaults", node.name,
                        f"`{node.name.value}()` builds with sizes fixed in its defaults ({shown}): callers that rely "
                        "on them get the full size under --shrink, which reduces only config.json sizes", SLOWS, LOW)
        elif isinstance(node, cst.Call):
            _call(ctx, node)


def _call(ctx: ModuleContext, call: cst.Call) -> None:
    fn = ctx.function_of(call)
    in_init = fn is not None and fn.name.value == "__init__"
    fixed = [(a.keyword.value, v) for a in call.args
             if a.keyword is not None and _sized(a.keyword.value) and (v := _size_literal(a.value)) is not None]
    q = ctx.qual(call.func)
    layer = q.startswith("torch.nn.") and q.rsplit(".", 1)[-1] in _LAYERS
    if layer and in_init:
        fixed += [(f"arg {i + 1}", v) for i, a in enumerate(call.args)
                  if a.keyword is None and (v := _size_literal(a.value)) is not None and v >= 16]
    if len(fixed) >= 2 or (fixed and in_init and max(v for _, v in fixed) >= 16):
        shown = ", ".join(f"{n}={v}" for n, v in fixed)
        what = ctx.code(call.func).strip()
        ctx.add("H17", "fixed-size-call", call,
                f"`{what}(...)` gets sizes written in the code ({shown}), not from the config: --shrink (config.json "
                "sizes) leaves this part at full size", SLOWS, LOW)


RULE = HazardRule(
    hazard="H17",
    title="Model sizes fixed in code, not from the config",
    detect=_h17_fixed_sizes,
    manual={
        "fixed-size-defaults": "the sizes are the model's architecture in code; a smaller test model needs them "
                               "overridden where the model is built (the shrink step's overrides), not patched",
        "fixed-size-call": "the sizes are the model's architecture in code; a smaller test model needs them "
                           "overridden where the model is built (the shrink step's overrides), not patched",
    },
    report_only=True,
    kb_topic="recipe:H17",
    left_as_written="sizes in code are the model's architecture; --shrink reduces config.json sizes only",
    fixtures=("tests/test_real_code_rewrites.py",),
)
