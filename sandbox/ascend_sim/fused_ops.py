"""CPU reference implementations of torch_npu fused ops, following their documented semantics.

These take and return plain CPU tensors; `custom_ops.py` wraps them for npu tensors and counts them as
NPU custom ops. Internals compute in float32 and cast back, as the fused kernels accumulate in float32.
The real ops' argument checks are in `fused_checks.py`. Choices where the docs are silent are listed in
docs/ascend-sim.md ("Fused ops").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import messages
from .fused_checks import check_fusion_attention, cum_ends

INT_MAX = 2147483647


# --- shared attention core ---------------------------------------------------------------------------


def _to_bnsd(x: torch.Tensor, layout: str, heads: int | None, head_dim: int | None) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout in ("BSH", "SBH"):
        if layout == "SBH":
            x = x.transpose(0, 1)
        b, s, h = x.shape
        if heads is None:
            assert head_dim is not None
            heads = h // head_dim
        return x.reshape(b, s, heads, h // heads).transpose(1, 2)
    raise NotImplementedError(
        f"ascend-sim: input_layout {layout!r} is not emulated (BSH, SBH, BSND, BNSD are)"
    )


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout in ("BSND", "BNSD_BSND"):
        return x.transpose(1, 2).contiguous()
    b, n, s, d = x.shape
    y = x.transpose(1, 2).reshape(b, s, n * d)
    return y.transpose(0, 1).contiguous() if layout == "SBH" else y


def _mask_4d(mask: torch.Tensor, b: int, n: int, sq: int, skv: int) -> torch.Tensor:
    m = mask.to(torch.bool)
    if m.dim() == 2:
        m = m[None, None]
    elif m.dim() == 3:
        m = m[:, None]
    # Masks larger than the scores (e.g. the 2048x2048 causal templates) are cropped.
    return m[..., :sq, :skv].expand(b, n, sq, skv)


def _band(sq: int, skv: int, pre: int, nxt: int, offset: int) -> torch.Tensor:
    """True where position (i, j) is masked out by the pre/next token window."""
    i = torch.arange(sq)[:, None] + offset
    j = torch.arange(skv)[None, :]
    return (j > i + nxt) | (j < i - pre)


def _sparse_mask(
    mask: torch.Tensor | None, sparse_mode: int, pre: int, nxt: int, b: int, n: int, sq: int, skv: int
) -> torch.Tensor | None:
    if mask is None:
        return None  # documented: without atten_mask, sparse_mode and the window do not apply (full)
    if sparse_mode == 0:
        assert mask is not None
        m = _mask_4d(mask, b, n, sq, skv)
        if pre < INT_MAX or nxt < INT_MAX:
            m = m | _band(sq, skv, pre, nxt, 0)
        return m
    if sparse_mode == 1:
        assert mask is not None
        return _mask_4d(mask, b, n, sq, skv)
    if sparse_mode == 2:  # leftUpCausal
        return _band(sq, skv, INT_MAX, 0, 0).expand(b, n, sq, skv)
    if sparse_mode == 3:  # rightDownCausal
        return _band(sq, skv, INT_MAX, 0, skv - sq).expand(b, n, sq, skv)
    if sparse_mode == 4:  # band, aligned bottom-right
        return _band(sq, skv, pre, nxt, skv - sq).expand(b, n, sq, skv)
    raise NotImplementedError(f"ascend-sim: sparse_mode={sparse_mode} is not emulated (0-4 are)")


def _repeat_kv(k: torch.Tensor, n_q: int) -> torch.Tensor:
    n_kv = k.shape[1]
    if n_q == n_kv:
        return k
    if n_q % n_kv:
        raise RuntimeError(f"head_num {n_q} must be a multiple of the key/value heads {n_kv}")
    return k.repeat_interleave(n_q // n_kv, dim=1)


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    bias: torch.Tensor | None,
    bias_before_scale: bool,
    masked: torch.Tensor | None,
    keep_prob: float = 1.0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """BNSD float32 attention; returns (out, row max, row sum of exp).

    Rows masked out entirely give 0 (row max 0, row sum 0). Few ops on purpose: the emulator runs this
    for every attention call of a ported model, and each op costs as much as the math on tiny tensors."""
    k = _repeat_kv(k, q.shape[1])
    v = _repeat_kv(v, q.shape[1])
    s = torch.matmul(q, k.transpose(-1, -2))
    if bias is not None and bias_before_scale:
        s = s.add_(bias)
        if scale != 1.0:
            s = s.mul_(scale)
    else:
        if scale != 1.0:
            s = s.mul_(scale)
        if bias is not None:
            s = s.add_(bias)
    if masked is not None:
        s = s.masked_fill_(masked, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    p = torch.softmax(s, dim=-1)
    # sum_j exp(s_j - max) = 1 / max_j p_j. A row of only -inf (masked out) gives NaN in softmax; the
    # kernel gives 0 there, with row max 0 and row sum 0.
    if masked is not None or bias is not None:
        p = p.nan_to_num_(0.0)
        safe_max = row_max.nan_to_num(neginf=0.0)
        row_sum = p.amax(dim=-1, keepdim=True).reciprocal_().nan_to_num_(posinf=0.0)
    else:
        safe_max = row_max
        row_sum = p.amax(dim=-1, keepdim=True).reciprocal_()
    if keep_prob < 1.0:
        gen = torch.Generator().manual_seed(seed)
        keep = torch.rand(p.shape, generator=gen) < keep_prob
        p = p * keep / keep_prob
    return torch.matmul(p, v), safe_max, row_sum


# --- npu_fusion_attention ------------------------------------------------------------------------------


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = INT_MAX,
    next_tockens: int = INT_MAX,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """Returns (attention_out, softmax_max, softmax_sum, softmax_out (reserved), seed, offset, mask_len)."""
    check_fusion_attention(query, key, value, head_num, input_layout, pse, atten_mask, keep_prob,
                           actual_seq_qlen, actual_seq_kvlen)
    if sink is not None:
        raise NotImplementedError("ascend-sim: npu_fusion_attention(sink=...) is not emulated")
    if input_layout == "TND":
        assert actual_seq_qlen is not None and actual_seq_kvlen is not None
        return _fusion_attention_tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob,
                                     pre_tockens, next_tockens, actual_seq_qlen, actual_seq_kvlen,
                                     sparse_mode, seed, offset)
    dtype = query.dtype
    head_dim = None
    if input_layout in ("BSH", "SBH"):
        head_dim = query.shape[-1] // head_num
    q = _to_bnsd(query.float(), input_layout, head_num, None)
    k = _to_bnsd(key.float(), input_layout, None, head_dim)
    v = _to_bnsd(value.float(), input_layout, None, head_dim)
    b, n, sq, _ = q.shape
    skv = k.shape[2]
    masked = _sparse_mask(atten_mask, sparse_mode, pre_tockens, next_tockens, b, n, sq, skv)
    bias = pse.float() if pse is not None else None
    out, row_max, row_sum = _attention(q, k, v, scale, bias, True, masked, keep_prob, seed)
    out_l = _from_bnsd(out, input_layout).to(dtype)
    # The kernel keeps the softmax statistics as float32 [B, N, Sq, 8] (broadcast for alignment).
    smax = row_max.expand(b, n, sq, 8)
    ssum = row_sum.expand(b, n, sq, 8)
    mask_len = 0 if keep_prob == 1.0 else b * n * sq * skv
    return out_l, smax, ssum, torch.empty(0, dtype=dtype), seed, offset, mask_len


def _fusion_attention_tnd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    pse: torch.Tensor | None,
    atten_mask: torch.Tensor | None,
    scale: float,
    keep_prob: float,
    pre: int,
    nxt: int,
    actual_seq_qlen: Sequence[int],
    actual_seq_kvlen: Sequence[int],
    sparse_mode: int,
    seed: int,
    offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """varlen: query [T, N, D], one sequence per cumulative length; trailing zero lengths are skipped.

    Each sequence is its own batch of one; sparse_mode 2/3/4 align their causal band per sequence, as
    the compressed 2048x2048 mask describes."""
    if pse is not None:
        raise NotImplementedError("ascend-sim: npu_fusion_attention(pse=...) in the TND layout is not emulated")
    if atten_mask is not None and sparse_mode in (0, 1):
        raise NotImplementedError("ascend-sim: a full atten_mask in the TND layout is not emulated "
                                  "(sparse_mode 2-4 is)")
    n = query.shape[1]
    outs: list[torch.Tensor] = []
    maxes: list[torch.Tensor] = []
    sums: list[torch.Tensor] = []
    q0 = k0 = 0
    for qe, ke in zip(cum_ends(actual_seq_qlen), cum_ends(actual_seq_kvlen), strict=True):
        q = query[q0:qe].float().transpose(0, 1)[None]
        k = key[k0:ke].float().transpose(0, 1)[None]
        v = value[k0:ke].float().transpose(0, 1)[None]
        sq, skv = q.shape[2], k.shape[2]
        masked = _sparse_mask(atten_mask, sparse_mode, pre, nxt, 1, n, sq, skv)
        out, row_max, row_sum = _attention(q, k, v, scale, None, True, masked, keep_prob, seed)
        outs.append(out[0].transpose(0, 1))
        maxes.append(row_max[0].transpose(0, 1).expand(sq, n, 8))
        sums.append(row_sum[0].transpose(0, 1).expand(sq, n, 8))
        q0, k0 = qe, ke
    out_t = torch.cat(outs).to(query.dtype)
    # softmax statistics in the default NTD layout: [N, T, 8]
    smax = torch.cat(maxes).transpose(0, 1).contiguous()
    ssum = torch.cat(sums).transpose(0, 1).contiguous()
    return out_t, smax, ssum, torch.empty(0, dtype=query.dtype), seed, offset, 0


# --- npu_prompt_flash_attention ----------------------------------------------------------------------


def npu_prompt_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    pse_shift: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    deq_scale1: torch.Tensor | None = None,
    quant_scale1: torch.Tensor | None = None,
    deq_scale2: torch.Tensor | None = None,
    quant_scale2: torch.Tensor | None = None,
    quant_offset2: torch.Tensor | None = None,
    num_heads: int = 1,
    scale_value: float = 1.0,
    pre_tokens: int = INT_MAX,
    next_tokens: int = 0,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    sparse_mode: int = 0,
) -> torch.Tensor:
    """softmax(scale_value * Q K^T + pse_shift, masked) V; output in the query layout (BNSD_BSND: BSND)."""
    if any(t is not None for t in (deq_scale1, quant_scale1, deq_scale2, quant_scale2, quant_offset2)):
        raise NotImplementedError("ascend-sim: quantized npu_prompt_flash_attention is not emulated")
    if sparse_mode not in (0, 1, 2, 3, 4):
        raise RuntimeError(f"sparse_mode {sparse_mode} is not supported (0-4)")
    dtype = query.dtype
    layout_in = "BNSD" if input_layout == "BNSD_BSND" else input_layout
    kv_heads = num_key_value_heads or num_heads
    q = _to_bnsd(query.float(), layout_in, num_heads, None)
    k = _to_bnsd(key.float(), layout_in, kv_heads, None)
    v = _to_bnsd(value.float(), layout_in, kv_heads, None)
    b, n, sq, _ = q.shape
    skv = k.shape[2]
    masked = _sparse_mask(atten_mask, sparse_mode, pre_tokens, next_tokens, b, n, sq, skv)
    if actual_seq_lengths_kv is not None:
        lens = _per_batch(actual_seq_lengths_kv, b)
        pad = torch.arange(skv)[None, :] >= torch.tensor(lens)[:, None]  # [B, Skv]
        pad4 = pad[:, None, None, :].expand(b, n, sq, skv)
        masked = pad4 if masked is None else masked | pad4
    bias = pse_shift.float()[..., :sq, :skv] if pse_shift is not None else None
    out, _, _ = _attention(q, k, v, scale_value, bias, False, masked)
    if actual_seq_lengths is not None:
        qlens = _per_batch(actual_seq_lengths, b)
        valid = torch.arange(sq)[None, :] < torch.tensor(qlens)[:, None]  # rows past the length stay 0
        out = out * valid[:, None, :, None]
    return _from_bnsd(out, input_layout).to(dtype)


def _per_batch(lengths: Sequence[int], b: int) -> list[int]:
    vals = [int(x) for x in lengths]
    if len(vals) == 1:
        return vals * b
    if len(vals) < b:
        raise RuntimeError(f"actual sequence lengths: got {len(vals)} values for batch {b}")
    return vals[:b]


# --- npu_rms_norm -------------------------------------------------------------------------------------


def npu_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (y, rstd); rstd is float32 with the normalised trailing dims kept as size 1."""
    nd = gamma.dim()
    if tuple(self.shape[self.dim() - nd :]) != tuple(gamma.shape):
        raise RuntimeError(
            f"gamma shape {tuple(gamma.shape)} must match the trailing dims of self {tuple(self.shape)}"
        )
    x = self.float()
    dims = tuple(range(self.dim() - nd, self.dim()))
    rstd = x.pow(2).mean(dim=dims, keepdim=True).add_(epsilon).rsqrt_()
    y = (x * rstd).mul_(gamma.float()).to(self.dtype)
    return y, rstd


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (y, rstd, x): x = x1 + x2 (in the input dtype), y = rms_norm(x) * gamma."""
    x = x1 + x2
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """swish(A) * B with A, B the halves of input along dim."""
    if input.shape[dim] % 2:
        raise RuntimeError(messages.param_invalid(
            "aclnnSwiGlu", f"the size of dim {dim} ({input.shape[dim]}) must be divisible by 2"))
    a, b = input.float().chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(input.dtype)


# --- npu_rotary_mul -----------------------------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_interleave(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def npu_rotary_mul(
    input: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    """input * r1 + rotate(input) * r2 (r1 = cos, r2 = sin), broadcasting r1/r2."""
    if input.dim() not in (3, 4):
        raise RuntimeError(f"npu_rotary_mul: input must be 3-D or 4-D, got {input.dim()}-D")
    x = input.float()
    if rotate is not None:
        rot = torch.matmul(x, rotate.float())
    elif rotary_mode == "half":
        rot = _rotate_half(x)
    elif rotary_mode == "interleave":
        rot = _rotate_interleave(x)
    else:
        raise RuntimeError(f"npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    return (x * r1.float() + rot * r2.float()).to(input.dtype)


# --- npu_moe_gating_top_k_softmax ---------------------------------------------------------------------


def npu_moe_gating_top_k_softmax(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax over experts, top-k -> (y, expert_idx int32, row_idx int32).

    row_idx[i, j] = j * rows + i (the documented arange(rows*k).reshape(k, rows).T). Rows marked
    finished get expert index = num_experts (out of range, so routing skips them).
    """
    if x.dim() not in (2, 3):
        raise RuntimeError(f"npu_moe_gating_top_k_softmax: x must be 2-D or 3-D, got {x.dim()}-D")
    experts = x.shape[-1]
    if not 0 < k <= min(experts, 1024):
        raise RuntimeError(f"npu_moe_gating_top_k_softmax: k must be in (0, {min(experts, 1024)}], got {k}")
    probs = torch.softmax(x.float(), dim=-1)
    y, idx = torch.topk(probs, k, dim=-1)
    idx = idx.to(torch.int32)
    if finished is not None:
        idx = torch.where(finished.to(torch.bool)[..., None], torch.full_like(idx, experts), idx)
    rows = math.prod(x.shape[:-1])
    row_idx = torch.arange(rows * k, dtype=torch.int32).reshape(k, rows).t().reshape(y.shape)
    return y.to(x.dtype), idx, row_idx.contiguous()
