"""H12: float16 weights and compute (`.half()`, dtype=torch.float16) on a chip whose cast policy differs.

One hazard class, one module: detector, fix (the reason it is manual), its knowledge-base topic
(see docs/rules.md)."""

from __future__ import annotations

import libcst as cst

from agents.rules.base import MEDIUM, NUMBERS, HazardRule
from agents.rules.context import ModuleContext

_FP16 = {"torch.float16", "torch.half"}
_DTYPE_KEYWORDS = {"dtype", "torch_dtype"}


def _h12_half(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "half" and not call.args and not ctx.is_module_ref(f.value):
            ctx.add("H12", "fp16-weights", call,
                    "`.half()` casts weights/activations to float16: whether the chip computes float16 natively "
                    "(or the port should cast to bfloat16/float32) is the target's cast policy", NUMBERS, MEDIUM)
            continue
        for a in call.args:
            is_dtype = (a.keyword is not None and a.keyword.value in _DTYPE_KEYWORDS) or (
                a.keyword is None and isinstance(f, cst.Attribute) and f.attr.value == "to")
            if is_dtype and ctx.qual(a.value) in _FP16:
                ctx.add("H12", "fp16-weights", a,
                        f"`{ctx.code(a).strip()}` asks for float16: on a chip without float16 compute it is "
                        "emulated or cast; follow the target's cast policy", NUMBERS, MEDIUM)


RULE = HazardRule(
    hazard="H12",
    title="float16 weights and compute",
    detect=_h12_half,
    manual={"fp16-weights": "the cast (keep float16, bfloat16 or float32) is the chip's cast policy: a numerics "
                            "choice made per target, not a rewrite"},
    kb_topic="recipe:H12",
    recipe="knowledge/recipes/H12.md",
    left_as_written="float16 as written; the chip's cast policy decides how it computes",
    fixtures=("tests/test_new_hazards.py",),
)
