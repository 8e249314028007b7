"""torch_npu's fused ops (`torch_npu.npu_*`) as the emulated host provides them: the CPU references of
fused_ops.py behind the real ops' argument checks (fused_checks.py), taking and returning npu tensors and
counted as one NPU op each (`npu::<name>`); the native engine's C++ twins run the common call shapes.

These run for every layer of every decode step of a port that uses them, so the wrapper is lean: the
arguments are matched to the checks' parameters without ``inspect.Signature.bind`` (tens of
microseconds a call), which only runs when a call does not fit the plain positional/keyword shape (it
then raises Python's own TypeError for a wrong call, as before)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from . import fused_checks, fused_ops, messages
from .runtime import RT

Binder = Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]


def _binder(ref: Callable[..., Any], wanted: set[str]) -> Binder:
    """args, kwargs of a call of ``ref`` -> the arguments named in ``wanted`` (defaults left to the
    check's own). Equivalent to ``sig.bind(*args, **kwargs).arguments`` filtered to ``wanted`` for
    every valid call; any other call goes through ``bind`` itself, which raises its TypeError."""
    sig = inspect.signature(ref)
    params = list(sig.parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    plain = all(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)
    n_pos = len(positional)

    def slow(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = sig.bind(*args, **kwargs).arguments
        return {k: v for k, v in bound.items() if k in wanted}

    if not plain:
        return slow

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > n_pos:
            return slow(args, kwargs)
        named = dict(zip(positional, args, strict=False))
        for k, v in kwargs.items():
            if k in named or k not in keywords:
                return slow(args, kwargs)  # a duplicate or unknown keyword: bind's TypeError
            named[k] = v
        if not required.issubset(named):
            return slow(args, kwargs)  # a missing argument: bind's TypeError
        return {k: v for k, v in named.items() if k in wanted}

    return bind


def _custom(name: str, ref: Callable[..., Any], fast: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Wrap a CPU reference so it takes npu tensors, returns npu tensors and counts as one NPU op.

    fast(module, *args, **kwargs): the native engine's C++ twin for the common call shapes (all tensors
    on npu, a chip with bf16, no autograd); it returns None for a call it does not cover, which then runs the
    reference with its checks and messages."""
    op_key = f"npu::{name}"
    counts = RT.custom_counts
    check = CHECKS.get(name)
    bind = _binder(ref, set(inspect.signature(check).parameters)) if check is not None else None

    def call(*args: Any, **kwargs: Any) -> Any:
        counts[op_key] = counts.get(op_key, 0) + 1
        if check is not None and bind is not None:
            # The real op's argument checks (dtype, rank, head dim) come first, on every path.
            check(**bind(args, kwargs))
        engine = RT.engine
        if fast is not None and engine.name == "native" and RT.profile.bf16 and not torch.is_grad_enabled():
            try:
                out = fast(engine.mod, *args, **kwargs)  # type: ignore[attr-defined]
            except TypeError:
                out = None  # arguments it does not take: the reference reports them
            if out is not None:
                return out
        seen_npu = False
        cpu_arg: torch.Tensor | None = None
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if engine.is_npu(a):
                    seen_npu = True
                elif cpu_arg is None and a.dim() > 0:
                    cpu_arg = a
        if not seen_npu:
            return ref(*args, **kwargs)
        if cpu_arg is not None:
            raise RuntimeError(messages.device_mismatch("npu:0", cpu_arg.device))
        if not RT.profile.bf16:
            _check_custom_dtypes(name, [*args, *kwargs.values()])
        uargs = [engine.to_cpu(a) if engine.is_npu(a) else a for a in args]
        ukw = {k: engine.to_cpu(a) if engine.is_npu(a) else a for k, a in kwargs.items()}
        return _rewrap(ref(*uargs, **ukw))

    call.__name__ = name
    call.__qualname__ = name
    call.__doc__ = ref.__doc__
    return call


def _fast_rms_norm(mod: Any, self: Any, gamma: Any, epsilon: float = 1e-6) -> Any:
    return mod.rms_norm(self, gamma, float(epsilon))


def _fast_rotary_mul(mod: Any, input: Any, r1: Any, r2: Any, rotary_mode: str = "half", rotate: Any = None) -> Any:
    if rotary_mode != "half" or rotate is not None:
        return None
    return mod.rotary_mul_half(input, r1, r2)


def _fast_fusion_attention(
    mod: Any,
    query: Any,
    key: Any,
    value: Any,
    head_num: int,
    input_layout: str,
    pse: Any = None,
    padding_mask: Any = None,
    atten_mask: Any = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = fused_ops.INT_MAX,
    next_tockens: int = fused_ops.INT_MAX,
    inner_precise: int = 0,
    prefix: Any = None,
    actual_seq_qlen: Any = None,
    actual_seq_kvlen: Any = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: Any = None,
    dropout_mask: Any = None,
    seed: int = 0,
    offset: int = 0,
) -> Any:
    """BNSD without mask, dropout or sink: the shape the generated attention helper uses."""
    plain = atten_mask is None and keep_prob == 1.0 and sink is None and actual_seq_qlen is None
    if input_layout != "BNSD" or not plain or sparse_mode not in (0, 1):
        return None
    outs = mod.fusion_attention_bnsd(query, key, value, pse, float(scale))
    return None if outs is None else (*outs, seed, offset, 0)


def _check_custom_dtypes(name: str, args: list[Any]) -> None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype is torch.bfloat16:
            exec_name = "aclnn" + "".join(p.capitalize() for p in name.removeprefix("npu_").split("_"))
            allowed = [torch.float32, torch.float16]
            raise RuntimeError(messages.dtype_not_supported(exec_name, "x", torch.bfloat16, allowed))


def _rewrap(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return RT.engine.to_npu(out) if out.device.type == "cpu" else out
    if isinstance(out, tuple):
        return tuple(_rewrap(o) for o in out)
    return out


CUSTOM_OPS: dict[str, Callable[..., Any]] = {
    "npu_fusion_attention": fused_ops.npu_fusion_attention,
    "npu_prompt_flash_attention": fused_ops.npu_prompt_flash_attention,
    "npu_rms_norm": fused_ops.npu_rms_norm,
    "npu_rotary_mul": fused_ops.npu_rotary_mul,
    "npu_moe_gating_top_k_softmax": fused_ops.npu_moe_gating_top_k_softmax,
    "npu_add_rms_norm": fused_ops.npu_add_rms_norm,
    "npu_swiglu": fused_ops.npu_swiglu,
}


CHECKS: dict[str, Callable[..., None]] = {
    "npu_fusion_attention": fused_checks.check_fusion_attention,
    "npu_rms_norm": fused_checks.check_rms_norm,
    "npu_rotary_mul": fused_checks.check_rotary_mul,
    "npu_add_rms_norm": fused_checks.check_add_rms_norm,
    "npu_swiglu": fused_checks.check_swiglu,
}


FAST: dict[str, Callable[..., Any]] = {
    "npu_fusion_attention": _fast_fusion_attention,
    "npu_rms_norm": _fast_rms_norm,
    "npu_rotary_mul": _fast_rotary_mul,
}


def torch_npu_ops() -> dict[str, Callable[..., Any]]:
    """The `torch_npu.npu_*` functions of the emulated build, fresh wrappers each install."""
    return {name: _custom(name, ref, FAST.get(name)) for name, ref in CUSTOM_OPS.items()}
