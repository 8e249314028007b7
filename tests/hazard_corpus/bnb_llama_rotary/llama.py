"""LLaMA in the original Meta layout (complex-valued rotary embeddings), with optional int8 linear layers
from bitsandbytes for low-memory inference."""
import math

import bitsandbytes as bnb  # HAZARD: cuda-only-import
import torch
import torch.nn.functional as F
from torch import nn


def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # HAZARD: complex-dtype, cpu-fallback-op


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))  # HAZARD: complex-dtype
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))  # HAZARD: complex-dtype
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)  # HAZARD: complex-dtype
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)  # HAZARD: complex-dtype
    return xq_out.type_as(xq), xk_out.type_as(xk)


def make_linear(i, o, quantize):
    if quantize:
        return bnb.nn.Linear8bitLt(i, o, bias=False, has_fp16_weights=False, threshold=6.0)
    return nn.Linear(i, o, bias=False)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)  # HAZARD: rms-norm-opportunity
        return out.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.head_dim = args["n_heads"], args["dim"] // args["n_heads"]
        q = args["quantize"]
        self.wq = make_linear(args["dim"], args["dim"], q)
        self.wk = make_linear(args["dim"], args["dim"], q)
        self.wv = make_linear(args["dim"], args["dim"], q)
        self.wo = make_linear(args["dim"], args["dim"], q)

    def forward(self, x, freqs_cis, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = F.softmax((scores + mask).float(), dim=-1).type_as(xq)
        return self.wo(torch.matmul(scores, xv).transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, multiple_of, quantize):
        super().__init__()
        hidden_dim = multiple_of * ((int(2 * hidden_dim / 3) + multiple_of - 1) // multiple_of)
        self.w1 = make_linear(dim, hidden_dim, quantize)
        self.w2 = make_linear(hidden_dim, dim, quantize)
        self.w3 = make_linear(dim, hidden_dim, quantize)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args["dim"], 4 * args["dim"], args["multiple_of"], args["quantize"])
        self.attention_norm = RMSNorm(args["dim"], eps=args["norm_eps"])
        self.ffn_norm = RMSNorm(args["dim"], eps=args["norm_eps"])

    def forward(self, x, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaForCausalLM(nn.Module):
    def __init__(self, params):
        super().__init__()
        self.tok_embeddings = nn.Embedding(params["vocab_size"], params["dim"])
        self.layers = nn.ModuleList(TransformerBlock(params) for _ in range(params["n_layers"]))
        self.norm = RMSNorm(params["dim"], eps=params["norm_eps"])
        self.output = nn.Linear(params["dim"], params["vocab_size"], bias=False)
        self.freqs_cis = precompute_freqs_cis(params["dim"] // params["n_heads"], params["max_seq_len"] * 2,
                                              params["rope_theta"])
        torch.set_default_dtype(torch.float16)  # HAZARD: fp16-weights
        self.to(dtype=torch.float16)  # HAZARD: fp16-weights
        torch.set_default_dtype(torch.float32)

    def forward(self, tokens):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        self.freqs_cis = self.freqs_cis.to(h.device)
        freqs_cis = self.freqs_cis[:seqlen]
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device).triu(1).type_as(h)
        for layer in self.layers:
            h = layer(h, freqs_cis, mask)
        return self.output(self.norm(h)).float()

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens=4):
        for _ in range(max_new_tokens):
            nxt = self(input_ids)[:, -1].argmax(-1, keepdim=True)
            input_ids = torch.cat([input_ids, nxt], dim=1)
        return input_ids


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 7), generator=g)}
