"""Attention on (batch, seq, heads, dim) tensors as flash-attn and xformers define it, through torch's SDPA.

One definition with two users: the reference run's CPU stand-ins call it (redirect.py ``CPU_REFERENCE``), and
the H16 codemod inserts its source into the patched module (agents/rules/h16_attention_calls.py,
``helper_source``), which must not import npuport. So it imports torch itself and carries the name the
patched code calls it by.
"""

from __future__ import annotations

import inspect


def _npuport_sdpa_bshd(q, k, v, dropout_p=0.0, scale=None, causal=False):  # type: ignore[no-untyped-def]
    """xformers / flash-attn attention on (batch, seq, heads, dim) tensors through torch's SDPA (hazard H16):
    the same layout, grouped k/v heads and a causal mask aligned to the bottom right as flash-attn's."""
    import torch

    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    mask = None
    if causal and q.shape[1] != k.shape[1]:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(k.shape[1] - q.shape[1])
        causal = False
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, dropout_p=dropout_p,
        is_causal=causal, scale=scale)
    return out.transpose(1, 2)


def helper_source() -> str:
    """The function's source as the codemod inserts it (its type-checker comment left out)."""
    return "\n\n" + inspect.getsource(_npuport_sdpa_bshd).replace("  # type: ignore[no-untyped-def]", "")
