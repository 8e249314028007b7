# tiny_llm: a tiny Llama-style decoder LLM.
#
#   tokens -> embeddings -> N x [RMSNorm -> GQA attention with rotary -> RMSNorm -> SwiGLU MLP]
#          -> RMSNorm -> tied LM head -> greedy generate with a KV cache (left-padded batches)
#
# Written for NVIDIA GPUs: fused layers from apex / xformers and a triton kernel when they are
# installed, NCCL for multi-GPU runs, and the attention-mask helper of transformers 4.34.
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import _expand_mask

try:
    from apex.normalization import FusedRMSNorm
except ImportError:
    FusedRMSNorm = None

try:
    import xformers.ops as xops
except ImportError:
    xops = None

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


if triton is not None:

    @triton.jit
    def _swiglu_kernel(gate_ptr, up_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
        pid = tl.program_id(axis=0)
        offsets = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        gate = tl.load(gate_ptr + offsets, mask=mask).to(tl.float32)
        up = tl.load(up_ptr + offsets, mask=mask).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(gate, up):
    """silu(gate) * up: one fused triton kernel on the GPU, the torch reference elsewhere."""
    if triton is not None and gate.is_cuda:
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        n = gate.numel()
        _swiglu_kernel[(triton.cdiv(n, 1024),)](gate, up, out, n, BLOCK=1024)
        return out
    return F.silu(gate) * up


def setup_device():
    """One process per GPU: torchrun sets LOCAL_RANK / WORLD_SIZE; each process sees only its own GPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl")
    torch.cuda.set_device(0)  # after the mask above, our GPU is always device 0
    return torch.device("cuda", 0)


class TinyLlmConfig:
    model_type = "tiny_llm"

    def __init__(self, config=None, **kwargs):
        values = dict(config or {})
        values.update(kwargs)
        values.setdefault("use_memory_efficient_attention", True)
        values.setdefault("use_fused_rms_norm", True)
        values.setdefault("use_triton_swiglu", True)
        values.setdefault("num_key_value_heads", values.get("num_attention_heads"))
        for key, value in values.items():
            setattr(self, key, value)
        assert self.num_attention_heads % self.num_key_value_heads == 0, "heads must group over kv heads"

    def get(self, key, default=None):
        return getattr(self, key, default)

    def to_dict(self):
        return dict(vars(self))


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------


class TinyLlmRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def make_rms_norm(config):
    if config.use_fused_rms_norm and FusedRMSNorm is not None:
        return FusedRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return TinyLlmRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class TinyLlmRotaryEmbedding(nn.Module):
    """cos / sin tables for every position, computed once in float64 and kept in float64."""

    def __init__(self, dim, max_positions, theta):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        positions = torch.arange(max_positions, dtype=torch.float64)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, position_ids, dtype):  # [b, s] -> cos, sin [b, s, dim]
        return self.cos_cached[position_ids].to(dtype), self.sin_cached[position_ids].to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):  # q, k: [b, h, s, hd]; cos, sin: [b, s, hd]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def make_causal_mask(q_len, kv_len, dtype, device):
    """[1, 1, q_len, kv_len] additive mask: query i (at position kv_len - q_len + i) sees keys <= it."""
    past = kv_len - q_len
    mask = torch.full((q_len, kv_len), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask = mask.triu(past + 1)
    return mask[None, None]


class TinyLlmAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, attn_bias, past_kv=None):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, cos, sin)
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)
            v = torch.cat([past_kv[1], v], dim=2)
        present = (k, v)

        groups = self.num_heads // self.num_kv_heads
        k_all = k.repeat_interleave(groups, dim=1)
        v_all = v.repeat_interleave(groups, dim=1)
        bias = attn_bias.expand(b, self.num_heads, s, k_all.shape[2])
        if self.config.use_memory_efficient_attention and xops is not None:
            # xformers wants [b, s, h, hd] and a materialised bias.
            out = xops.memory_efficient_attention(
                q.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2),
                attn_bias=bias.contiguous(), scale=self.scale,
            )
        else:
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=bias, scale=self.scale).transpose(1, 2)
        return self.o_proj(out.reshape(b, s, -1)), present


class TinyLlmMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.use_triton = config.use_triton_swiglu
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        act = swiglu(gate, up) if self.use_triton else F.silu(gate) * up
        return self.down_proj(act)


class TinyLlmDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = make_rms_norm(config)
        self.self_attn = TinyLlmAttention(config)
        self.post_attention_layernorm = make_rms_norm(config)
        self.mlp = TinyLlmMLP(config)

    def forward(self, x, cos, sin, attn_bias, past_kv=None):
        attn_out, present = self.self_attn(self.input_layernorm(x), cos, sin, attn_bias, past_kv)
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x)), present


# ----------------------------------------------------------------------------------------------
# The whole model
# ----------------------------------------------------------------------------------------------


class TinyLlmForCausalLM(nn.Module):
    config_class = TinyLlmConfig

    def __init__(self, config):
        super().__init__()
        if not isinstance(config, TinyLlmConfig):
            config = TinyLlmConfig(config)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(TinyLlmDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = make_rms_norm(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.get("tie_word_embeddings", True):
            self.lm_head.weight = self.embed_tokens.weight
        head_dim = config.hidden_size // config.num_attention_heads
        self.rotary_emb = TinyLlmRotaryEmbedding(head_dim, config.max_position_embeddings, config.rope_theta)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # Scaled fan-in init: gain > 1 keeps attention peaked, so the prompt matters in a tiny model.
        gain = self.config.get("initializer_gain", 1.0)
        if isinstance(module, nn.Linear) and module is not self.lm_head:
            nn.init.normal_(module.weight, std=gain / math.sqrt(module.weight.shape[1]))
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=gain / math.sqrt(module.weight.shape[1]))

    def build_attn_bias(self, attention_mask, q_len, dtype):
        """Padding (from the [b, kv_len] 0/1 mask) + causal, as one additive [b, 1, q_len, kv_len] bias."""
        kv_len = attention_mask.shape[1]
        padding = _expand_mask(attention_mask, dtype, tgt_len=q_len)
        causal = make_causal_mask(q_len, kv_len, dtype, attention_mask.device)
        return (padding + causal).clamp(min=torch.finfo(dtype).min)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None):
        """Logits [b, s, vocab] and the new KV cache. attention_mask covers past + current tokens."""
        b, s = input_ids.shape
        past_len = 0 if past_key_values is None else past_key_values[0][0].shape[2]
        if attention_mask is None:
            attention_mask = torch.ones(b, past_len + s, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -s:]
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(position_ids, x.dtype)
        attn_bias = self.build_attn_bias(attention_mask, s, x.dtype)
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, cos, sin, attn_bias, None if past_key_values is None else past_key_values[i])
            presents.append(present)
        return self.lm_head(self.norm(x)).float(), presents

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens=8, eos_token_id=None):
        """Greedy decoding with a KV cache over a left-padded batch; returns the new token ids,
        LongTensor [batch, new_tokens]."""
        device = setup_device()
        input_ids = input_ids.to(device)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attention_mask = attention_mask.cuda()
        if dist.is_initialized():  # every rank decodes rank 0's prompt
            dist.broadcast(input_ids, src=0)
            dist.broadcast(attention_mask, src=0)

        logits, past = self(input_ids, attention_mask)
        new_ids = []
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device="cuda")
        for _ in range(max_new_tokens):
            next_ids = logits[:, -1, :].argmax(dim=-1)
            if eos_token_id is not None:
                next_ids = torch.where(finished, self.config.pad_token_id, next_ids)
                finished = finished | (next_ids == eos_token_id)
            new_ids.append(next_ids)
            if eos_token_id is not None and finished.all().item():
                break
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            logits, past = self(next_ids[:, None], attention_mask, past_key_values=past)
        torch.cuda.synchronize()
        return torch.stack(new_ids, dim=1)
