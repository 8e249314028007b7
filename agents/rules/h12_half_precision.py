"""H12: float16 weights and compute (`.half()`, dtype=torch.float16) and the chip's cast policy.

One hazard class, one module: detector, fix (the cast policy per chip), its knowledge-base topic
(see docs/rules.md). The policy keeps float16 where the target computes float16 and casts to bfloat16
(else float32) where it does not; the reason names where the dtype facts come from: the chip registry
(sandbox/targets/chips.py), the knowledge base's CANN dtype table for matmul, or a probe of the CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import libcst as cst

from agents.rules.base import MEDIUM, NUMBERS, Fix, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.kit import CodemodResult, Rewriter, run_codemod

if TYPE_CHECKING:
    from sandbox.targets import Target

_FP16 = {"torch.float16", "torch.half"}
_DTYPE_KEYWORDS = {"dtype", "torch_dtype"}
_DEFAULT_DTYPE = {"torch.set_default_dtype"}


def _h12_half(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "half" and not call.args and not ctx.is_module_ref(f.value):
            ctx.add("H12", "fp16-weights", call,
                    "`.half()` casts weights/activations to float16: whether the chip computes float16 natively "
                    "(or the port should cast to bfloat16/float32) is the target's cast policy", NUMBERS, MEDIUM)
            continue
        q = ctx.qual(f)
        for a in call.args:
            is_dtype = (a.keyword is not None and a.keyword.value in _DTYPE_KEYWORDS) or (
                a.keyword is None and ((isinstance(f, cst.Attribute) and f.attr.value == "to") or q in _DEFAULT_DTYPE))
            if is_dtype and ctx.qual(a.value) in _FP16:
                ctx.add("H12", "fp16-weights", a,
                        f"`{ctx.code(a).strip()}` asks for float16: on a chip without float16 compute it is "
                        "emulated or cast; follow the target's cast policy", NUMBERS, MEDIUM)


# --- the cast policy ---------------------------------------------------------------------------

def _kb_matmul_dtypes(chip: str) -> tuple[list[str] | None, str]:
    """float dtypes of aclnnMatmul on ``chip`` from the knowledge base's CANN tables (None when no table)."""
    try:
        from knowledge.kb.dtypes import supported_dtypes

        sup = supported_dtypes("aclnnMatmul", chip)
    except Exception:  # noqa: BLE001 - no knowledge base built: the chip registry alone decides
        return None, ""
    if sup is None or not sup.dtypes:
        return None, ""
    first = next(iter(sup.dtypes.values()))
    names = {"FLOAT16": "float16", "BFLOAT16": "bfloat16", "FLOAT": "float32", "FLOAT32": "float32"}
    return sorted({names[d.upper()] for d in first if d.upper() in names}), sup.source


_CPU_FP16 = ("avx512_fp16", "amx_fp16", "fphp", "asimdhp")  # x86 / Arm feature flags of float16 arithmetic
_CPU_BF16 = ("avx512_bf16", "amx_bf16", "bf16")


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo", encoding="utf-8").read()  # noqa: SIM115 - read once
    except OSError:
        return set()
    return {w for line in text.splitlines() if line.lower().startswith(("flags", "features")) for w in line.split()}


def _cpu_dtypes() -> tuple[tuple[str, ...], str]:
    """The CPU's float dtypes: float16 where the CPU has float16 arithmetic (its feature flags) and this
    torch build runs the float16 kernels a decoder needs (matmul, softmax, layer norm: probed)."""
    import torch

    flags = _cpu_flags()
    units = [f for f in _CPU_FP16 if f in flags]
    bf16 = [f for f in _CPU_BF16 if f in flags]
    try:
        x = torch.ones(4, 4, dtype=torch.float16)
        y = torch.nn.functional.layer_norm((x @ x).softmax(-1), (4,))
        probe = y.dtype == torch.float16 and bool(torch.isfinite(y).all())
    except (RuntimeError, NotImplementedError):
        probe = False
    dtypes = ("float32", *(("bfloat16",) if bf16 else ()), *(("float16",) if units and probe else ()))
    why = (f"CPU float16 units: {', '.join(units) or 'none'}; bfloat16 units: {', '.join(bf16) or 'none'}; "
           f"torch {torch.__version__} float16 kernels (matmul, softmax, layer_norm) {'run' if probe else 'fail'}")
    return dtypes, why


def chip_dtypes(target: Target | None) -> tuple[tuple[str, ...], str]:
    """The floating dtypes the target computes, and where that fact comes from."""
    from sandbox.targets import get_chip, target_spec_of

    if target is None or not target_spec_of(target).npu_like:
        return _cpu_dtypes()
    chip = get_chip(target.options.get("chip"))  # the port's chip; none recorded: the default
    key = chip.key
    dtypes, why = tuple(chip.dtypes), f"chip registry: Ascend {key} ({chip.product}) has kernels for " \
                                      f"{', '.join(chip.dtypes)}"
    kb, source = _kb_matmul_dtypes(key)
    if kb is not None:
        dtypes = tuple(d for d in dtypes if d in kb or d == "float32")
        why += f"; knowledge base ({source}): aclnnMatmul on {key} takes {', '.join(kb)}"
    return dtypes, why


def cast_policy(target: Target | None) -> tuple[str, str]:
    """(dtype, reason): float16 is kept where the target computes float16; else bfloat16 (same range as
    float32, so no overflow where float16 had none), else float32."""
    dtypes, why = chip_dtypes(target)
    from sandbox.targets import target_spec_of

    where = target_spec_of(target).name
    if "float16" in dtypes:
        return "float16", f"keep float16 on {where}: {why}"
    if "bfloat16" in dtypes:
        return "bfloat16", f"float16 -> bfloat16 on {where}: no float16 compute ({why}); bfloat16 keeps the " \
                           "16-bit memory footprint with float32's range"
    return "float32", f"float16 -> float32 on {where}: neither float16 nor bfloat16 compute ({why})"


def port_compute_dtype(state: Mapping[str, Any]) -> str:
    """The dtype the port computes in, for the validator's tolerance: the cast policy's choice where the
    model casts to float16 (an H12 finding), else float32 (the reference's dtype)."""
    from agents.state import findings_of, target_if_resolved

    if not any(f.hazard == "H12" for f in findings_of(state)):
        return "float32"
    return cast_policy(target_if_resolved(state))[0]


class CastPolicy(Rewriter):
    """`.half()`, `dtype=torch.float16`, `.to(torch.float16)`, `set_default_dtype(torch.float16)` -> ``dtype``."""

    def __init__(self, dtype: str) -> None:
        super().__init__()
        self.dtype = dtype
        self._mirroring = 0  # depth of `if` branches taken only when the data already is float16

    def _dtype(self) -> cst.BaseExpression:
        return cst.parse_expression(f"torch.{self.dtype}")

    def visit_If(self, node: cst.If) -> None:
        # `if dtype in (torch.float16, torch.bfloat16): cache = cache.half()` follows the model's dtype (a
        # config's torch_dtype the policy does not rewrite): casting it elsewhere mixes dtypes in one op
        self._mirroring += _mirrors_dtype(node.test)

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.BaseStatement:
        self._mirroring -= _mirrors_dtype(original.test)
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if self._mirroring:
            return updated
        f = updated.func
        if isinstance(f, cst.Attribute) and f.attr.value == "half" and not updated.args:
            self.note(original, f".half() -> .to(torch.{self.dtype})")
            return updated.with_changes(func=f.with_changes(attr=cst.Name("to")), args=[cst.Arg(self._dtype())])
        name = f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""
        if name == "autocast" and self.dtype == "float32" and any(
                a.keyword is not None and a.keyword.value == "dtype" and _is_fp16(a.value) for a in updated.args):
            # autocast to float32 is no autocast (and CPU autocast rejects float32): switch it off
            self.note(original, "float16 autocast -> enabled=False (the target computes float32)")
            kept = [a for a in updated.args if a.keyword is None or a.keyword.value not in ("dtype", "enabled")]
            return updated.with_changes(args=[*kept,
                                              cst.Arg(cst.Name("False"), keyword=cst.Name("enabled"), equal=_EQ)])
        is_to = isinstance(f, cst.Attribute) and f.attr.value == "to"
        is_default = isinstance(f, cst.Attribute) and f.attr.value == "set_default_dtype"
        args = []
        for a in updated.args:
            dtype_arg = (a.keyword is not None and a.keyword.value in _DTYPE_KEYWORDS) or (
                a.keyword is None and (is_to or is_default))
            if dtype_arg and _is_fp16(a.value):
                self.note(original, f"{EMPTY.code_for_node(a.value)} -> torch.{self.dtype}")
                a = a.with_changes(value=self._dtype())
            args.append(a)
        return updated.with_changes(args=args)


EMPTY = cst.Module(body=[])
_EQ = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _mirrors_dtype(test: cst.BaseExpression) -> int:
    """1 when an `if` test asks whether a dtype is float16 (`dtype == torch.float16`, `x.dtype in (torch.half,
    ...)`): its branch casts to float16 because the data already is."""
    code = EMPTY.code_for_node(test).replace(" ", "")
    return int("dtype" in code and any(t in code for t in ("torch.float16", "torch.half")))


def _is_fp16(node: cst.BaseExpression) -> bool:
    return EMPTY.code_for_node(node).replace(" ", "") in _FP16


def fp16_cast_policy(source: str, *, target: Target | None = None, dtype: str | None = None,
                     **_: Any) -> CodemodResult:
    """Apply the target's cast policy to float16 casts (``dtype`` overrides the policy, for tests)."""
    chosen, why = (dtype, f"cast to {dtype} as asked") if dtype else cast_policy(target)
    if chosen == "float16":
        return CodemodResult(source, False, [why])
    result = run_codemod(source, lambda _m: CastPolicy(chosen))
    return CodemodResult(result.source, result.changed, [f"{e} ({why})" for e in result.edits])


RULE = HazardRule(
    hazard="H12",
    title="float16 weights and compute",
    detect=_h12_half,
    fixes=(Fix("fp16-cast-policy", fp16_cast_policy, "float16 casts follow the target chip's cast policy",
               frozenset({"fp16-weights"}), order=45),),
    kb_topic="recipe:H12",
    left_as_written="float16 kept: the target computes float16",
    fixtures=("tests/test_new_hazards.py", "tests/test_cast_world_fallback.py"),
)
