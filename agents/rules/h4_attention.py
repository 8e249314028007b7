"""H4: attention implementation and NPU fused-op opportunities (flash_attention_2, SDPA, RMSNorm, rotary, softmax(QK^T)V).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import libcst as cst

from agents.rules.base import (
    BLOCKS,
    HIGH,
    LOW,
    MEDIUM,
    SLOWS,
    Fix,
    HazardRule,
)
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import (
    last_name,
    string_value,
)
from agents.rules.h4_fused import fused_rms_norm, fused_rotary_mul
from agents.rules.h4_fused_attention import fused_attention

# --- detector ----------------------------------------------------------------------------------

def _h4_attention(ctx: ModuleContext) -> None:
    impl_nodes: list[cst.CSTNode] = []
    strings = {(string_value(s) or "") for s in ctx.ix.strings}
    for s in ctx.ix.strings:
        value = string_value(s)
        if value not in ("flash_attention_2", "flash_attention_3"):
            continue
        impl_nodes.append(s)
        parent = ctx.parent(s)
        if isinstance(parent, cst.ComparisonTarget | cst.Comparison):
            ctx.add("H4", "flash-attention-2-branch", s,
                    f"code path taken only with attn_implementation \"{value}\": it is dead on Ascend, where the "
                    "model takes its other attention branch; check that branch is efficient", SLOWS, LOW)
        elif isinstance(parent, cst.DictElement) and parent.key is s:
            ctx.add("H4", "flash-attention-2-impl", s,
                    f"attention table entry \"{value}\" maps to a FlashAttention class that needs CUDA", BLOCKS,
                    MEDIUM)
        else:
            ctx.add("H4", "flash-attention-2-impl", s,
                    f"selects attn_implementation \"{value}\": it imports flash_attn and fails on Ascend; use "
                    "\"sdpa\" (or \"eager\")", BLOCKS, HIGH)
    chooses_impl = impl_nodes or any(r.qual.endswith("_attn_implementation") for r in ctx.refs)
    # a registry lookup (transformers' ALL_ATTENTION_FUNCTIONS) includes sdpa
    uses_sdpa = "sdpa" in strings or any(r.qual.endswith(("scaled_dot_product_attention", "ALL_ATTENTION_FUNCTIONS"))
                                         for r in ctx.refs)
    if chooses_impl and not uses_sdpa:
        first = impl_nodes[0] if impl_nodes else next(r.node for r in ctx.refs
                                                      if r.qual.endswith("_attn_implementation"))
        ctx.add("H4", "sdpa-missing", first,
                "the model chooses an attention implementation but has no SDPA path: on Ascend it falls back to "
                "eager attention (slow); an SDPA or npu_fusion_attention path keeps it fused", SLOWS, MEDIUM)
    for ref in ctx.refs:
        if ref.qual.endswith("scaled_dot_product_attention") and isinstance(ctx.parent(ref.node), cst.Call):
            ctx.add("H4", "sdpa-used", ref.node,
                    "SDPA runs on Ascend; torch_npu uses its fused kernel only for some masks, dtypes and head "
                    "sizes, so check the op report (npu_fusion_attention gives full control)", SLOWS, LOW)
    for site, bias in ctx.flow.attention_sites:
        extra = ("with an additive bias: npu_prompt_flash_attention takes it as pse_shift, or "
                 "npu_fusion_attention as pse" if bias == "bias" else
                 "with a mask: npu_fusion_attention takes it as atten_mask" if bias == "mask" else
                 "npu_fusion_attention / npu_prompt_flash_attention do it in one kernel")
        ctx.add("H4", "fused-attention-opportunity", site,
                f"hand-written attention softmax(QK^T)V {extra}; one fused kernel instead of several ops and a "
                "materialised score matrix", SLOWS, LOW)
    for site in ctx.flow.rms_sites:
        ctx.add("H4", "rms-norm-opportunity", site,
                "hand-written RMSNorm (x * rsqrt(mean(x^2) + eps)): torch_npu.npu_rms_norm does it in one kernel",
                SLOWS, LOW)
    _h4_rotary(ctx)


def _h4_rotary(ctx: ModuleContext) -> None:
    seen_fns: set[cst.CSTNode | None] = set()
    for call in ctx.ix.calls:
        if last_name(call.func) == "rotate_half":
            fn = ctx.function_of(call)
            if fn not in seen_fns:
                seen_fns.add(fn)
                ctx.add("H4", "rotary-opportunity", call,
                        "rotary embedding via rotate_half (x*cos + rotate_half(x)*sin): torch_npu.npu_rotary_mul "
                        "does it in one kernel", SLOWS, LOW)


RULE = HazardRule(
    hazard="H4",
    title="Attention implementation and NPU fused-op opportunities",
    detect=_h4_attention,
    fixes=(
        Fix("fused-rms-norm", fused_rms_norm, "RMSNorm formula through torch_npu.npu_rms_norm where present",
            frozenset({"rms-norm-opportunity"}), order=80),
        Fix("fused-rotary-mul", fused_rotary_mul, "rotate_half rotary through torch_npu.npu_rotary_mul where present",
            frozenset({"rotary-opportunity"}), order=90),
        Fix("fused-attention", fused_attention,
            "softmax(QK^T)V through torch_npu.npu_fusion_attention where present",
            frozenset({"fused-attention-opportunity"}), order=100),
    ),
    manual={
        "flash-attention-2-branch": "a branch for another attention implementation: dead on Ascend, nothing to fix",
        "flash-attention-2-impl": "the attention implementation is a configuration choice (sdpa or eager)",
        "sdpa-missing": "adding an SDPA path is a model change",
        "sdpa-used": "SDPA runs on Ascend; the op report says whether the fused kernel was taken",
    },
    kb_topic="recipe:H4",
    recipe="knowledge/recipes/H4.md",
    left_as_written="a performance opportunity; not needed for a correct port",
    fixtures=("tests/test_scanner.py", "tests/test_perf_codemods.py", "examples/tiny_llm"),
)
