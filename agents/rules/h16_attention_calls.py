"""H16: direct xformers / flash-attn attention calls -> torch's scaled_dot_product_attention.

One hazard class, one module: detector, fix (codemod to SDPA where the call's options have an exact SDPA
form), its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from agents.rules.base import BLOCKS, HIGH, Fix, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import aliases, dotted, walk_nodes
from agents.rules.kit import CodemodResult, Rewriter, run_codemod
from sandbox.cuda_redirect.sdpa import helper_source

# qualified name -> the positional parameters after (q, k, v), mapped to the helper's keywords
XFORMERS = ("attn_bias", "p", "scale")
FLASH = ("dropout_p", "softmax_scale", "causal")
CALLS: dict[str, tuple[str, ...]] = {
    "xformers.ops.memory_efficient_attention": XFORMERS,
    "xformers.ops.fmha.memory_efficient_attention": XFORMERS,
    "flash_attn.flash_attn_func": FLASH,
    "flash_attn.flash_attn_interface.flash_attn_func": FLASH,
}
_TO_HELPER = {"p": "dropout_p", "dropout_p": "dropout_p", "scale": "scale", "softmax_scale": "scale",
              "causal": "causal"}
_CAUSAL_BIASES = {"xformers.ops.LowerTriangularMask", "xformers.ops.fmha.attn_bias.LowerTriangularMask",
                  "xformers.ops.fmha.LowerTriangularMask"}

_EQ = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
SDPA_HELPER_MARKER = "def _npuport_sdpa_bshd("
SDPA_HELPER = helper_source()  # one definition, shared with the reference run (sandbox/cuda_redirect/sdpa.py)


def _helper_args(call: cst.Call, params: tuple[str, ...], qual: Any) -> list[cst.Arg] | None:
    """The helper's arguments for this call, or None when an option has no exact SDPA form."""
    pos = [a for a in call.args if a.keyword is None]
    if len(pos) < 3 or any(a.star for a in call.args) or len(pos) > 3 + len(params):
        return None
    named = {params[i]: a.value for i, a in enumerate(pos[3:])}
    named |= {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    out = [cst.Arg(a.value) for a in pos[:3]]
    for key, value in named.items():
        if key == "attn_bias":
            if isinstance(value, cst.Name) and value.value == "None":
                continue
            if isinstance(value, cst.Call) and qual(value.func) in _CAUSAL_BIASES and not value.args:
                out.append(cst.Arg(cst.Name("True"), keyword=cst.Name("causal"), equal=_EQ))
                continue
            return None
        if key not in _TO_HELPER:
            return None  # window_size, alibi_slopes, return_attn_probs ...: no exact SDPA form
        out.append(cst.Arg(value, keyword=cst.Name(_TO_HELPER[key]), equal=_EQ))
    return out


def _qualifier(module: cst.Module) -> Any:
    imports = [n for n in walk_nodes(module) if isinstance(n, cst.Import | cst.ImportFrom)]
    table = aliases(imports)

    def qual(node: cst.CSTNode) -> str:
        d = dotted(node) or ""
        head, _, rest = d.partition(".")
        full = table.get(head)
        return (f"{full}.{rest}" if rest else full) if full else d

    return qual


def _h16_attention(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        q = ctx.qual(call.func)
        if q in CALLS:
            rule = "xformers-attention-call" if q.startswith("xformers") else "flash-attn-call"
            exact = _helper_args(call, CALLS[q], ctx.qual) is not None
            ctx.add("H16", rule, call,
                    f"`{q}` is a CUDA-only attention kernel: "
                    + ("torch's scaled_dot_product_attention computes the same (the NPU's fused attention "
                       "serves it)" if exact else "its options have no exact SDPA form; port it by hand"),
                    BLOCKS, HIGH, fixable=exact)


class AttentionToSdpa(Rewriter):
    def __init__(self, qual: Any) -> None:
        super().__init__()
        self.qual = qual

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        q = self.qual(original.func)
        if q in CALLS and (args := _helper_args(updated, CALLS[q], self.qual)) is not None:
            self.note(original, f"{q} -> scaled_dot_product_attention (_npuport_sdpa_bshd)")
            return cst.Call(func=cst.Name("_npuport_sdpa_bshd"), args=args)
        return updated


def attention_to_sdpa(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda m: AttentionToSdpa(_qualifier(m)), [(SDPA_HELPER, SDPA_HELPER_MARKER)])


RULE = HazardRule(
    hazard="H16",
    title="Direct xformers / flash-attn attention calls",
    detect=_h16_attention,
    fixes=(Fix("attention-to-sdpa", attention_to_sdpa, "xformers / flash-attn attention -> SDPA",
               frozenset({"xformers-attention-call", "flash-attn-call"}), order=15),),
    kb_topic="recipe:H16",
    left_as_written="an option without an exact SDPA form: the CUDA-only call stays and needs a hand port",
    fixtures=("tests/test_new_hazards.py",),
)
