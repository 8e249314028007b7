"""Argument checks of torch_npu's fused ops (dtype, rank, layout, head dim), as the real ops make them,
raising the aclnn EZ1001 / parameter frames (messages.py). Shared by both engines' paths: npu_api.py runs
them before any implementation (the native twins included) and fused_ops.py's references call them too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import messages


def cum_ends(lengths: Sequence[int]) -> list[int]:
    ends = [int(x) for x in lengths]
    while len(ends) > 1 and ends[-1] == 0:  # documented: trailing zeros = batches not computed
        ends.pop()
    return ends


# --- real-op argument checks (dtype, rank, head dim), shared by both engines' paths -------------------

_FA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FA_RANK = {"BSH": 3, "SBH": 3, "TND": 3, "BSND": 4, "BNSD": 4}


def check_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    keep_prob: float = 1.0,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
) -> None:
    """The documented constraints of npu_fusion_attention (torch_npu docs, "约束说明")."""
    exec_name = "aclnnFlashAttentionScore" if input_layout != "TND" else "aclnnFlashAttentionVarLenScore"
    for arg, t in (("query", query), ("key", key), ("value", value), ("pse", pse)):
        if t is not None and t.dtype not in _FA_DTYPES:
            raise RuntimeError(messages.dtype_not_supported(exec_name, arg, t.dtype, _FA_DTYPES))
    for arg, t in (("key", key), ("value", value), ("pse", pse)):
        if t is not None and t.dtype != query.dtype:
            raise RuntimeError(messages.param_invalid(
                exec_name, f"the dtype of {arg} ({messages.dt_name(t.dtype)}) must equal the dtype of query "
                f"({messages.dt_name(query.dtype)})"))
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
        raise RuntimeError(messages.dtype_not_supported(exec_name, "attenMask", atten_mask.dtype,
                                                        (torch.bool, torch.uint8)))
    rank = _FA_RANK.get(input_layout)
    if rank is None:
        raise RuntimeError(messages.param_invalid(
            exec_name, f"input_layout {input_layout!r} is not supported, should be in [BSH, SBH, BSND, BNSD, TND]"))
    for arg, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() != rank:
            raise RuntimeError(messages.param_invalid(
                exec_name, f"{arg} must be {rank}-D for input_layout {input_layout}, got {t.dim()}-D"))
    if tuple(key.shape[:-1]) != tuple(value.shape[:-1]):
        raise RuntimeError(messages.param_invalid(exec_name, "the shapes of key and value must match"))
    if input_layout in ("BSH", "SBH"):
        if head_num <= 0 or query.shape[-1] % head_num:
            raise RuntimeError(messages.param_invalid(
                exec_name, f"H of query ({query.shape[-1]}) must be a multiple of head_num ({head_num})"))
        dq = query.shape[-1] // head_num
        dk = dq
    else:
        n_axis = {"BSND": 2, "BNSD": 1, "TND": 1}[input_layout]
        if query.shape[n_axis] != head_num:
            raise RuntimeError(messages.param_invalid(
                exec_name, f"head_num ({head_num}) must equal N of query ({query.shape[n_axis]})"))
        nkv = key.shape[n_axis]
        if nkv == 0 or head_num % nkv:
            raise RuntimeError(messages.param_invalid(
                exec_name, f"N of query ({head_num}) must be a multiple of N of key/value ({nkv})"))
        dq, dk = query.shape[-1], key.shape[-1]
    if not 1 <= dq <= 768 or dq != dk:
        raise RuntimeError(messages.param_invalid(
            exec_name, f"head dim must satisfy Dq == Dk in [1, 768], got Dq={dq}, Dk={dk}"))
    if not 1 <= head_num <= 256:
        raise RuntimeError(messages.param_invalid(exec_name, f"head_num must be in [1, 256], got {head_num}"))
    if not 0.0 < keep_prob <= 1.0:
        raise RuntimeError(messages.param_invalid(exec_name, f"keep_prob must be in (0, 1], got {keep_prob}"))
    varlen = actual_seq_qlen is not None or actual_seq_kvlen is not None
    if (input_layout == "TND") != varlen or (varlen and (actual_seq_qlen is None or actual_seq_kvlen is None)):
        raise RuntimeError(messages.param_invalid(
            exec_name, "actual_seq_qlen and actual_seq_kvlen are required with, and only with, input_layout TND"))
    if varlen:
        assert actual_seq_qlen is not None and actual_seq_kvlen is not None
        if len(actual_seq_qlen) != len(actual_seq_kvlen):
            raise RuntimeError(messages.param_invalid(
                exec_name, "actual_seq_qlen and actual_seq_kvlen must have the same length"))
        qe, ke = cum_ends(actual_seq_qlen), cum_ends(actual_seq_kvlen)
        if qe[-1] != query.shape[0] or ke[-1] != key.shape[0] or qe != sorted(qe) or ke != sorted(ke):
            raise RuntimeError(messages.param_invalid(
                exec_name, "actual_seq_qlen/actual_seq_kvlen must be non-decreasing cumulative lengths ending at "
                f"T (query {query.shape[0]}, key {key.shape[0]})"))


def check_rms_norm(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> None:
    # dtypes only: the gamma/self shape check (and its message) is npu_rms_norm's own, on both engines
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    for arg, t in (("x", self), ("gamma", gamma)):
        if t.dtype not in dtypes:
            raise RuntimeError(messages.dtype_not_supported("aclnnRmsNorm", arg, t.dtype, dtypes))


def check_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> None:
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    for arg, t in (("x1", x1), ("x2", x2), ("gamma", gamma)):
        if t.dtype not in dtypes:
            raise RuntimeError(messages.dtype_not_supported("aclnnAddRmsNorm", arg, t.dtype, dtypes))
    if x1.shape != x2.shape or gamma.dtype != x1.dtype:
        raise RuntimeError(messages.param_invalid(
            "aclnnAddRmsNorm", "x1 and x2 must have the same shape, and gamma the dtype of x1"))
    check_rms_norm(x1, gamma, epsilon)
    nd = gamma.dim()
    if nd > x1.dim() or tuple(x1.shape[x1.dim() - nd :]) != tuple(gamma.shape):
        raise RuntimeError(messages.param_invalid(
            "aclnnAddRmsNorm",
            f"gamma shape {tuple(gamma.shape)} must match the trailing dims of x1 {tuple(x1.shape)}"))


def check_swiglu(input: torch.Tensor, dim: int = -1) -> None:
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    if input.dtype not in dtypes:
        raise RuntimeError(messages.dtype_not_supported("aclnnSwiGlu", "x", input.dtype, dtypes))
    if not -input.dim() <= dim < input.dim():
        raise RuntimeError(messages.param_invalid(
            "aclnnSwiGlu", f"dim must be in [{-input.dim()}, {input.dim() - 1}], got {dim}"))


def check_rotary_mul(
    input: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half",
    rotate: torch.Tensor | None = None
) -> None:
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    for arg, t in (("x", input), ("r1", r1), ("r2", r2)):
        if t.dtype not in dtypes:
            raise RuntimeError(messages.dtype_not_supported("aclnnRotaryPositionEmbedding", arg, t.dtype, dtypes))
    # input's rank is npu_rotary_mul's own check (and message); r1/r2 broadcast to input, same D
    if r1.shape != r2.shape or r1.shape[-1] != input.shape[-1]:
        raise RuntimeError(messages.param_invalid(
            "aclnnRotaryPositionEmbedding",
            f"r1 and r2 must have equal shapes with D = {input.shape[-1]}; got {tuple(r1.shape)}, {tuple(r2.shape)}"))
    if rotary_mode == "half" and input.shape[-1] % 2:
        raise RuntimeError(messages.param_invalid(
            "aclnnRotaryPositionEmbedding", f"D must be even for rotary_mode 'half', got {input.shape[-1]}"))
