"""CPU references of torch_npu fused ops (sandbox/ascend_sim/fused_ops.py) against plain torch compositions.

The references are pure functions on CPU tensors (no emulator install needed); one subprocess case
checks they also run on emulated npu tensors and count as NPU custom ops, not fallbacks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_ascend_sim import run_sim  # tests/ is on sys.path (pytest rootdir-relative import)

from sandbox.ascend_sim import fused_ops as fo

B, N, S, D = 2, 4, 6, 8


def _qkv(
    sq: int = S, skv: int = S, n_kv: int = N, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, N, sq, D, generator=g, dtype=dtype)
    k = torch.randn(B, n_kv, skv, D, generator=g, dtype=dtype)
    v = torch.randn(B, n_kv, skv, D, generator=g, dtype=dtype)
    return q, k, v


def _to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    bsh = x.transpose(1, 2).reshape(b, s, n * d)
    return bsh.transpose(0, 1).contiguous() if layout == "SBH" else bsh


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
def test_fusion_attention_layouts_match_sdpa(layout: str) -> None:
    q, k, v = _qkv()
    scale = 1 / math.sqrt(D)
    ref = F.scaled_dot_product_attention(q, k, v, scale=scale)
    out = fo.npu_fusion_attention(
        _to_layout(q, layout), _to_layout(k, layout), _to_layout(v, layout), N, layout, scale=scale
    )
    assert len(out) == 7
    assert out[0].shape == _to_layout(q, layout).shape
    torch.testing.assert_close(out[0], _to_layout(ref, layout), rtol=1e-5, atol=1e-5)
    assert out[1].shape == (B, N, S, 8) and out[1].dtype == torch.float32
    assert out[4:] == (0, 0, 0)


def test_fusion_attention_bool_mask_true_means_masked() -> None:
    q, k, v = _qkv()
    mask = torch.rand(B, 1, S, S, generator=torch.Generator().manual_seed(1)) > 0.6
    mask[..., 0] = False  # keep one visible key per row
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, scale=0.3)
    out = fo.npu_fusion_attention(q, k, v, N, "BNSD", atten_mask=mask, scale=0.3)[0]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fusion_attention_causal_sparse_modes_and_gqa() -> None:
    q, k, v = _qkv(n_kv=2)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    ref = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=0.5)
    causal = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    for mode in (2, 3):
        out = fo.npu_fusion_attention(q, k, v, N, "BNSD", atten_mask=causal, sparse_mode=mode, scale=0.5)[0]
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # sparse_mode 0 with pre/next tokens: the window masks j > i + next_tockens.
    mask0 = torch.zeros(S, S, dtype=torch.bool)
    out0 = fo.npu_fusion_attention(q, k, v, N, "BNSD", atten_mask=mask0, next_tockens=0, scale=0.5)[0]
    torch.testing.assert_close(out0, ref, rtol=1e-5, atol=1e-5)


def test_fusion_attention_pse_follows_documented_formula() -> None:
    q, k, v = _qkv()
    pse = torch.randn(B, N, S, S, generator=torch.Generator().manual_seed(2))
    scale = 0.25
    ref = torch.softmax(scale * (q @ k.transpose(-1, -2) + pse), dim=-1) @ v
    out = fo.npu_fusion_attention(q, k, v, N, "BNSD", pse=pse, scale=scale)[0]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fusion_attention_keeps_dtype_and_dropout_is_seeded() -> None:
    q, k, v = _qkv(dtype=torch.float16)
    a = fo.npu_fusion_attention(q, k, v, N, "BNSD", scale=0.3, keep_prob=0.9, seed=7)
    b = fo.npu_fusion_attention(q, k, v, N, "BNSD", scale=0.3, keep_prob=0.9, seed=7)
    assert a[0].dtype == torch.float16
    assert torch.equal(a[0], b[0]) and a[6] == B * N * S * S and a[4] == 7


def test_prompt_flash_attention_pse_shift_and_layouts() -> None:
    q, k, v = _qkv(sq=S, skv=S + 2)
    pse = torch.randn(1, N, S, S + 2, generator=torch.Generator().manual_seed(3))
    scale = 1 / math.sqrt(D)
    ref = torch.softmax(scale * (q @ k.transpose(-1, -2)) + pse, dim=-1) @ v
    for layout in ("BNSD", "BSH"):
        out = fo.npu_prompt_flash_attention(
            _to_layout(q, layout),
            _to_layout(k, layout),
            _to_layout(v, layout),
            pse_shift=pse,
            num_heads=N,
            scale_value=scale,
            input_layout=layout,
        )
        torch.testing.assert_close(out, _to_layout(ref, layout), rtol=1e-5, atol=1e-5)
    out_bsnd = fo.npu_prompt_flash_attention(
        q, k, v, pse_shift=pse, num_heads=N, scale_value=scale, input_layout="BNSD_BSND"
    )
    torch.testing.assert_close(out_bsnd, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_prompt_flash_attention_mask_window_defaults_are_causal() -> None:
    q, k, v = _qkv()
    pad = torch.zeros(B, 1, S, S, dtype=torch.bool)
    pad[1, ..., -2:] = True  # batch 1: last two keys are padding
    scale = 0.4
    # next_tokens defaults to 0: with a mask given, the window also hides future keys.
    causal = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~(pad | causal), scale=scale)
    out = fo.npu_prompt_flash_attention(
        q, k, v, atten_mask=pad, num_heads=N, scale_value=scale, input_layout="BNSD"
    )
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    ref_full = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad, scale=scale)
    out_full = fo.npu_prompt_flash_attention(
        q, k, v, atten_mask=pad, num_heads=N, scale_value=scale, input_layout="BNSD", next_tokens=fo.INT_MAX
    )
    torch.testing.assert_close(out_full, ref_full, rtol=1e-5, atol=1e-5)


def test_rms_norm_matches_manual_and_returns_rstd() -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float16)
    gamma = torch.randn(16, dtype=torch.float16)
    y, rstd = fo.npu_rms_norm(x, gamma, epsilon=1e-5)
    xf = x.float()
    ref_rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(y, (xf * ref_rstd * gamma.float()).half())
    assert rstd.dtype == torch.float32 and rstd.shape == (3, 5, 1)
    torch.testing.assert_close(rstd, ref_rstd)
    with pytest.raises(RuntimeError, match="gamma shape"):
        fo.npu_rms_norm(x, torch.ones(8))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_rotary_mul_half_and_interleave() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 4, 5, 8, generator=g)
    ang = torch.randn(1, 1, 5, 8, generator=g)
    cos, sin = ang.cos(), ang.sin()
    torch.testing.assert_close(fo.npu_rotary_mul(x, cos, sin), x * cos + _rotate_half(x) * sin)
    rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    torch.testing.assert_close(fo.npu_rotary_mul(x, cos, sin, "interleave"), x * cos + rot * sin)
    # The rotate matrix form: x @ R reproduces rotate_half.
    half = 4
    r = torch.zeros(8, 8)
    r[half:, :half] = -torch.eye(half)
    r[:half, half:] = torch.eye(half)
    torch.testing.assert_close(fo.npu_rotary_mul(x, cos, sin, rotate=r), x * cos + _rotate_half(x) * sin)


def test_moe_gating_top_k_softmax() -> None:
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(5))
    y, idx, row = fo.npu_moe_gating_top_k_softmax(x, k=2)
    ref_y, ref_idx = torch.softmax(x, -1).topk(2, dim=-1)
    torch.testing.assert_close(y, ref_y)
    assert idx.dtype == torch.int32 and torch.equal(idx, ref_idx.int())
    assert row.dtype == torch.int32 and torch.equal(
        row, torch.arange(10, dtype=torch.int32).reshape(2, 5).t()
    )
    finished = torch.tensor([False, True, False, False, True])
    _, idx_f, _ = fo.npu_moe_gating_top_k_softmax(x, finished, k=2)
    assert torch.equal(idx_f[finished], torch.full((2, 2), 6, dtype=torch.int32))
    assert torch.equal(idx_f[~finished], idx[~finished])


def test_fused_ops_on_npu_tensors_count_as_custom_ops() -> None:
    out = run_sim(
        """
        import torch_npu
        x = torch.randn(2, 3, 16)
        g = torch.ones(16)
        y, rstd = torch_npu.npu_rms_norm(x.npu(), g.npu())
        q = torch.randn(1, 2, 4, 8)
        o = torch_npu.npu_prompt_flash_attention(q.npu(), q.npu(), q.npu(), num_heads=2, input_layout="BNSD",
                                                 scale_value=0.3, next_tokens=65535)
        OUT["devices"] = [str(y.device), str(rstd.device), str(o.device)]
        OUT["cpu_ok"] = torch.equal(torch_npu.npu_rms_norm(x, g)[0], y.cpu())
        try:
            torch_npu.npu_rms_norm(x.npu(), g)
        except RuntimeError as e:
            OUT["mix"] = str(e)
        rep = op_report()
        OUT["ops"] = {k: v for k, v in rep["npu_ops"].items() if k.startswith("npu::")}
        OUT["fallbacks"] = rep["fallbacks"]
        """
    )
    assert out["devices"] == ["npu:0", "npu:0", "npu:0"]
    assert out["cpu_ok"] is True
    assert out["mix"].startswith("Expected all tensors to be on the same device")
    assert out["ops"] == {"npu::npu_rms_norm": 3, "npu::npu_prompt_flash_attention": 1}
    assert out["fallbacks"] == {}
