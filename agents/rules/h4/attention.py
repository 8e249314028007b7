"""H4: attention implementation and NPU fused-op opportunities (flash_attention_2, SDPA, RMSNorm, rotary,
softmax(QK^T)V).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

from typing import Any

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
    walk_nodes,
)
from agents.rules.h4.attn_impl import (
    CONFIG_RULE,
    TABLE_WITHOUT_SDPA,
    config_attn_impl,
    detect_config,
    plan_params,
)
from agents.rules.h4.fused import _square_base, fused_rms_norm, fused_rms_norm_spans, fused_rotary_mul
from agents.rules.h4.fused_attention import fused_attention
from agents.rules.kit import CodemodResult, Rewriter, run_codemod

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
        if isinstance(parent, cst.Element):  # `impl in ("eager", "flash_attention_2")`: a test, like ==
            container = ctx.parent(parent)
            if container is not None and isinstance(ctx.parent(container), cst.ComparisonTarget | cst.Comparison):
                parent = ctx.parent(container)
        if isinstance(parent, cst.ComparisonTarget | cst.Comparison):
            ctx.add("H4", "flash-attention-2-branch", s,
                    f"code path taken only with attn_implementation \"{value}\": it is dead on Ascend, where the "
                    "model takes its other attention branch; check that branch is efficient", SLOWS, LOW)
        elif isinstance(parent, cst.DictElement) and parent.key is s:
            table = ctx.parent(parent)
            keys = {string_value(e.key) for e in getattr(table, "elements", ()) if isinstance(e, cst.DictElement)}
            if "sdpa" in keys or "eager" not in keys:
                ctx.add("H4", "flash-attention-2-impl", s,
                        f"attention table entry \"{value}\" maps to a FlashAttention class that needs CUDA; left as "
                        "written: the entry is dead once nothing selects it", BLOCKS, MEDIUM, fixable=False)
            else:  # the port's selections become "eager" (h4_attn_impl.impl_for): "sdpa" would be a KeyError
                ctx.add("H4", TABLE_WITHOUT_SDPA, s,
                        f"attention table entry \"{value}\" maps to a FlashAttention function that needs CUDA, and "
                        "the table has no \"sdpa\" entry: the model's FlashAttention selections become \"eager\", "
                        "which it has", BLOCKS, MEDIUM, fixable=False)
        else:
            chosen = _selects_impl(parent, ctx.parent(parent) if parent is not None else None, s)
            ctx.add("H4", "flash-attention-2-impl", s,
                    f"selects attn_implementation \"{value}\": it imports flash_attn and fails on Ascend; use "
                    "\"sdpa\" (torch's SDPA runs on Ascend and the CPU)"
                    + ("" if chosen else "; left as written: not a keyword, default or assignment of "
                                         "attn_implementation, so npuport cannot tell what else reads it"),
                    BLOCKS, HIGH, fixable=chosen)
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
    rewritten: list[tuple[int, int]] | None = None
    for site in ctx.flow.rms_sites:
        kind, dim = _norm_kind(ctx, site)
        if kind == "layer":
            where = f" over dim {dim}" + (" (channels-first, a LayerNorm2d)" if dim in ("1", "-3") else "")
            ctx.add("H4", "layer-norm-formula", site,
                    f"hand-written LayerNorm{where}: (x - mean) / sqrt(var + eps) centres x, so it is NOT an RMSNorm "
                    "and npu_rms_norm does not apply; F.layer_norm (fused on Ascend) fits once that dim is last",
                    SLOWS, LOW)
            continue
        if rewritten is None:
            rewritten = fused_rms_norm_spans(ctx.module, ctx.positions)
        line = ctx.pos(site)[0]
        fixable = any(a <= line <= b for a, b in rewritten)
        ctx.add("H4", "rms-norm-opportunity", site,
                "hand-written RMSNorm (x * rsqrt(mean(x^2) + eps)): torch_npu.npu_rms_norm does it in one kernel"
                + ("" if fixable else "; left as written: fused-rms-norm rewrites only `x * rsqrt(mean(x^2, -1, "
                                      "keepdim=True) + eps)` over the last dim"), SLOWS, LOW, fixable=fixable)
    _h4_rotary(ctx)


_IMPL_NAMES = ("attn_implementation", "_attn_implementation")
FLASH_IMPLS = ("flash_attention_2", "flash_attention_3")


def _selects_impl(parent: cst.CSTNode | None, grand: cst.CSTNode | None, s: cst.CSTNode) -> bool:
    """The string is the value of an attn_implementation keyword, parameter default or assignment."""
    if isinstance(parent, cst.Arg) and parent.keyword is not None:
        return parent.keyword.value in _IMPL_NAMES
    if isinstance(parent, cst.Param):
        return parent.name.value in _IMPL_NAMES and parent.default is s
    if isinstance(parent, cst.Assign) and parent.value is s and len(parent.targets) == 1:
        t = parent.targets[0].target
        name = t.attr.value if isinstance(t, cst.Attribute) else t.value if isinstance(t, cst.Name) else ""
        return name in _IMPL_NAMES
    return False


class _ImplToSdpa(Rewriter):
    """attn_implementation="flash_attention_2" (keyword, parameter default, assignment) -> "sdpa" (or the
    implementation the plan chose for the whole model, h4_attn_impl.impl_for)."""

    def __init__(self, impl: str = "sdpa") -> None:
        super().__init__()
        self.impl = impl

    def _swap(self, node: cst.BaseExpression | None, where: str) -> cst.BaseExpression | None:
        if isinstance(node, cst.SimpleString) and node.evaluated_value in FLASH_IMPLS:
            q = node.prefix + node.quote
            shown = "SDPA" if self.impl == "sdpa" else self.impl
            self.note(node, f"{where}={node.value} -> \"{self.impl}\" (flash-attn needs CUDA; {shown} runs on "
                            "Ascend and CPU)")
            return node.with_changes(value=f"{q}{self.impl}{node.quote}")
        return None

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        if original.keyword is not None and original.keyword.value in _IMPL_NAMES:
            new = self._swap(original.value, original.keyword.value)
            if new is not None:
                return updated.with_changes(value=new)
        return updated

    def leave_Param(self, original: cst.Param, updated: cst.Param) -> cst.Param:
        if original.name.value in _IMPL_NAMES:
            new = self._swap(original.default, original.name.value)
            if new is not None:
                return updated.with_changes(default=new)
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if len(original.targets) == 1:
            t = original.targets[0].target
            name = t.attr.value if isinstance(t, cst.Attribute) else t.value if isinstance(t, cst.Name) else ""
            if name in _IMPL_NAMES:
                new = self._swap(original.value, name)
                if new is not None:
                    return updated.with_changes(value=new)
        return updated


def attn_impl_sdpa(source: str, *, impl: str = "sdpa", **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: _ImplToSdpa(impl))


def _norm_kind(ctx: ModuleContext, site: cst.CSTNode) -> tuple[str, str]:
    """("layer" | "rms", the mean's dim) for a sqrt/rsqrt of a mean of squares: "layer" when the squared
    value is centred (x - mean), directly or through a local variable."""
    fn = ctx.function_of(site)
    defs: dict[str, cst.BaseExpression] = {}
    if fn is not None:
        for n in walk_nodes(fn):
            if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name) \
                    and ctx.pos(n)[0] <= ctx.pos(site)[0]:
                defs[n.targets[0].target.value] = n.value

    def expand(e: cst.CSTNode, depth: int = 0) -> list[cst.CSTNode]:
        out = list(walk_nodes(e))
        if depth < 3:
            for n in list(out):
                if isinstance(n, cst.Name) and n.value in defs:
                    out += expand(defs[n.value], depth + 1)
        return out

    means = [n for n in expand(site) if isinstance(n, cst.Call) and last_name(n.func) == "mean"]
    for mean in means:
        method = isinstance(mean.func, cst.Attribute) and not ctx.is_module_ref(mean.func.value)
        squared = mean.func.value if isinstance(mean.func, cst.Attribute) and method else \
            (mean.args[0].value if mean.args else mean)
        base = _square_base(squared)
        dim_arg = next((a.value for a in mean.args if a.keyword is not None and a.keyword.value == "dim"), None)
        if dim_arg is None:
            positional = [a.value for a in mean.args if a.keyword is None]
            dim_arg = positional[0] if method and positional else (positional[1] if len(positional) > 1 else None)
        dim = ctx.code(dim_arg).strip() if dim_arg is not None else "all"
        if base is not None and any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Subtract)
                                    for n in expand(base)):
            return "layer", dim
        if base is not None:
            return "rms", dim
    return "rms", "?"


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
    detect_text=detect_config,
    fixes=(
        Fix("attn-impl-sdpa", attn_impl_sdpa, "attn_implementation \"flash_attention_2\" -> \"sdpa\" (\"eager\" where "
            "the model's attention table has no sdpa)", frozenset({"flash-attention-2-impl"}), order=40,
            plan_params=plan_params),
        Fix("config-attn-impl", config_attn_impl, "config.json's FlashAttention implementation -> the one the code "
            "gets", frozenset({CONFIG_RULE}), order=41, plan_params=plan_params),
        Fix("fused-rms-norm", fused_rms_norm, "RMSNorm formula through torch_npu.npu_rms_norm where present",
            frozenset({"rms-norm-opportunity"}), order=80),
        Fix("fused-rotary-mul", fused_rotary_mul, "rotate_half rotary through torch_npu.npu_rotary_mul where present",
            frozenset({"rotary-opportunity"}), order=90),
        Fix("fused-attention", fused_attention,
            "softmax(QK^T)V through torch_npu.npu_fusion_attention where present",
            frozenset({"fused-attention-opportunity"}), order=100),
    ),
    manual={
        TABLE_WITHOUT_SDPA: "an entry of the model's table: dead once nothing selects it (the selections become eager)",
        "flash-attention-2-branch": "a branch for another attention implementation: dead on Ascend, nothing to fix",
        "sdpa-missing": "adding an SDPA path is a model change",
        "sdpa-used": "SDPA runs on Ascend; the op report says whether the fused kernel was taken",
        "layer-norm-formula": "a LayerNorm over a non-last dim: F.layer_norm needs that dim moved last, a layout "
                              "change",
    },
    kb_topic="recipe:H4",
    left_as_written="a performance opportunity; not needed for a correct port",
    fixtures=("tests/test_scanner.py", "tests/test_perf_codemods.py", "examples/tiny_llm"),
)
