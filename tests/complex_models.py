"""Toy remote-code folders that compute in complex numbers, written by tests into tmp: the SHAPES real releases
have, not any release's code.

- ``write_complex_rotary_lm``: a LLaMA-style causal LM whose rotary table is kept complex
  (``precompute_freqs_cis`` with ``torch.polar``, ``view_as_complex(x) * freqs_cis``), indexed by position
  ids as HF-style decoders do; indexing a complex table is what the NPU's aclnnIndex rejects.
- ``write_hyena_fft_lm``: a Hyena-style long-convolution LM: an implicit filter (positional features through a
  small MLP) applied by an FFT convolution ``fftconv(u, k, D)``; dividing its spectrum and the inverse FFT of a
  complex input are what NPU kernels reject.
Both are HF folders (config.json auto_map, a PretrainedConfig, a PreTrainedModel with GenerationMixin)."""

from __future__ import annotations

import json
from pathlib import Path

CONFIGURATION = '''from transformers import PretrainedConfig


class ToyConfig(PretrainedConfig):
    model_type = "{model_type}"

    def __init__(self, vocab_size=96, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                 max_position_embeddings=64, rope_theta=10000.0, filter_order=16, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.filter_order = filter_order
        super().__init__(**kwargs)
'''

ROTARY = '''import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_toy import ToyConfig


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
    return freqs_cis


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor):
    ndim = x.ndim
    assert freqs_cis.shape == (x.shape[0], x.shape[1], x.shape[-1])
    shape = [d if i in (0, 1, ndim - 1) else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis) -> Tuple[torch.Tensor, torch.Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        out = torch.matmul(F.softmax(scores.float(), dim=-1).type_as(xq), xv)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn = Attention(config)
        self.norm1 = nn.LayerNorm(config.hidden_size)
        self.norm2 = nn.LayerNorm(config.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, 2 * config.hidden_size), nn.GELU(),
                                 nn.Linear(2 * config.hidden_size, config.hidden_size))

    def forward(self, x, freqs_cis, mask):
        h = x + self.attn(self.norm1(x), freqs_cis, mask)
        return h + self.mlp(self.norm2(h))


class ToyPreTrainedModel(PreTrainedModel):
    config_class = ToyConfig
    base_model_prefix = "model"


class ToyRotaryForCausalLM(ToyPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.num_hidden_layers)])
        self.norm = nn.LayerNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(config.hidden_size // config.num_attention_heads,
                                                               config.max_position_embeddings * 2, config.rope_theta),
                             persistent=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.tok

    def forward(self, input_ids, attention_mask: Optional[torch.Tensor] = None, position_ids=None, **kwargs):
        bsz, seqlen = input_ids.shape
        h = self.tok(input_ids)
        if position_ids is None:
            position_ids = torch.arange(seqlen, device=h.device).unsqueeze(0).expand(bsz, -1)
        freqs_cis = self.freqs_cis[position_ids]
        mask = torch.full((seqlen, seqlen), float("-inf"), device=h.device).triu(1)
        for layer in self.layers:
            h = layer(h, freqs_cis, mask)
        return CausalLMOutputWithPast(logits=self.lm_head(self.norm(h)).float())

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}
'''

HYENA = '''import math

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_toy import ToyConfig


def fftconv(u, k, D):
    """A convolution through the Fourier domain (the convolution theorem)."""
    seqlen = u.shape[-1]
    fft_size = 2 * seqlen
    k_f = torch.fft.rfft(k.to(torch.float32), n=fft_size) / fft_size
    u_f = torch.fft.rfft(u.to(dtype=torch.float32), n=fft_size)
    y = torch.fft.irfft(u_f * k_f, n=fft_size, norm="forward")[..., :seqlen]
    out = y + u * D.unsqueeze(-1)
    return out.to(dtype=u.dtype)


class HyenaSin(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.freq = nn.Parameter(torch.ones(1, config.filter_order))

    def forward(self, x):
        return torch.sin(self.freq * x)


class ImplicitFilter(nn.Module):
    """A long filter as a function of position: positional features through a small MLP, windowed."""

    def __init__(self, config):
        super().__init__()
        L = config.max_position_embeddings
        t = torch.linspace(0, 1, L)[None, :, None]
        w = 2 * math.pi * torch.linspace(0, L - 1, L)[None, :, None] / L
        f = torch.linspace(1e-4, 2, 3)[None, None]
        self.register_buffer("z", torch.cat([t, torch.cos(-f * w), torch.sin(-f * w)], dim=-1))
        self.register_buffer("t", t)
        self.mlp = nn.Sequential(nn.Linear(7, config.filter_order), HyenaSin(config),
                                 nn.Linear(config.filter_order, config.hidden_size, bias=False))
        self.register_buffer("deltas", torch.linspace(-1.0, -4.0, config.hidden_size)[None, None])

    def forward(self, L):
        h = self.mlp(self.z[:, :L])
        return (h * torch.exp(self.t[:, :L] * self.deltas)).transpose(1, 2)[0]


class HyenaOperator(nn.Module):
    def __init__(self, config):
        super().__init__()
        d = config.hidden_size
        self.in_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.short_filter = nn.Conv1d(3 * d, 3 * d, 3, padding=2, groups=3 * d)
        self.filter_fn = ImplicitFilter(config)
        self.bias = nn.Parameter(torch.randn(d))

    def forward(self, u):
        L = u.size(-2)
        uc = self.short_filter(self.in_proj(u).transpose(1, 2))[..., :L]
        x0, x1, v = uc.split(u.size(-1), dim=1)
        v = fftconv(v * x1, self.filter_fn(L), self.bias)
        return self.out_proj((v * x0).transpose(1, 2))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.mixer = HyenaOperator(config)
        self.norm1 = nn.LayerNorm(config.hidden_size)
        self.norm2 = nn.LayerNorm(config.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, 2 * config.hidden_size), nn.GELU(),
                                 nn.Linear(2 * config.hidden_size, config.hidden_size))

    def forward(self, x):
        h = x + self.mixer(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class ToyPreTrainedModel(PreTrainedModel):
    config_class = ToyConfig
    base_model_prefix = "model"


class ToyHyenaForCausalLM(ToyPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.num_hidden_layers)])
        self.norm = nn.LayerNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.tok

    def forward(self, input_ids, attention_mask=None, **kwargs):
        h = self.tok(input_ids)
        for layer in self.layers:
            h = layer(h)
        return CausalLMOutput(logits=self.lm_head(self.norm(h)).float())

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}
'''


def _write(root: Path, model_type: str, cls: str, modeling: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [cls], "model_type": model_type,
              "auto_map": {"AutoConfig": "configuration_toy.ToyConfig",
                           "AutoModelForCausalLM": f"modeling_toy.{cls}"},
              "vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "max_position_embeddings": 64, "rope_theta": 10000.0, "filter_order": 16, "torch_dtype": "float32"}
    (root / "config.json").write_text(json.dumps(config, indent=1))
    (root / "configuration_toy.py").write_text(CONFIGURATION.format(model_type=model_type))
    (root / "modeling_toy.py").write_text(modeling)
    return root


def write_complex_rotary_lm(root: Path) -> Path:
    return _write(root, "toy-complex-rope", "ToyRotaryForCausalLM", ROTARY)


def write_hyena_fft_lm(root: Path) -> Path:
    return _write(root, "toy-hyena", "ToyHyenaForCausalLM", HYENA)
