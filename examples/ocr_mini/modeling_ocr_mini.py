# ocr_mini: a tiny OCR-style vision-language model.
#
#   image -> conv patch embed -> windowed ViT (relative-position bias)
#         -> "decoder as encoder" (learned queries over the vision tokens)
#         -> projector -> image features scattered into the text embeddings
#         -> MoE language model (1 shared + routed experts, top-k) -> greedy generate
#
# Written for NVIDIA GPUs; it needs CUDA and flash-attn installed.
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from flash_attn import flash_attn_func, flash_attn_varlen_func

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")

# Pick the device once at import time.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class OcrMiniConfig:
    model_type = "ocr_mini"

    def __init__(self, config=None, **kwargs):
        values = dict(config or {})
        values.update(kwargs)
        values.setdefault("_attn_implementation", "eager")
        values.setdefault("use_flash_attn", False)
        values.setdefault("torch_dtype", "float32")
        for key, value in values.items():
            setattr(self, key, value)
        grid = self.image_size // self.patch_size
        assert grid % self.vision_window_size == 0, "patch grid must tile into windows"

    def get(self, key, default=None):
        return getattr(self, key, default)

    def to_dict(self):
        return dict(vars(self))


# ----------------------------------------------------------------------------------------------
# Vision tower: conv patch embedding + windowed ViT with a learned relative-position bias
# ----------------------------------------------------------------------------------------------


def window_partition(x, window):
    """[b, h, w, d] -> [b * num_windows, window * window, d]"""
    b, h, w, d = x.shape
    x = x.view(b, h // window, window, w // window, window, d).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, d)


def window_unpartition(windows, window, h, w):
    """[b * num_windows, window * window, d] -> [b, h, w, d]"""
    b = windows.shape[0] // ((h // window) * (w // window))
    x = windows.view(b, h // window, w // window, window, window, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, -1)


class PatchEmbed(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Conv2d(
            config.num_channels,
            config.vision_hidden_size,
            kernel_size=config.patch_size,
            stride=config.patch_size,
        )

    def forward(self, pixel_values):
        return self.proj(pixel_values).permute(0, 2, 3, 1)  # [b, gh, gw, d]


class RelPosAttention(nn.Module):
    """Multi-head self-attention over a side x side token grid with an additive bias per
    relative offset (one learned table entry per (dy, dx) and head)."""

    def __init__(self, dim, num_heads, side):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * side - 1) ** 2, num_heads))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

        coords = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (side - 1)
        index = rel[..., 0] * (2 * side - 1) + rel[..., 1]
        self.register_buffer("relative_position_index", index, persistent=False)

    def forward(self, x):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        attn = attn + bias.view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
        attn = attn.softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, d)
        return self.proj(out)


class VisionBlock(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        dim = config.vision_hidden_size
        grid = config.image_size // config.patch_size
        self.windowed = layer_idx not in config.vision_global_layers
        self.window = config.vision_window_size if self.windowed else grid
        self.norm1 = nn.LayerNorm(dim)
        self.attn = RelPosAttention(dim, config.vision_num_heads, self.window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, dim * config.vision_mlp_ratio),
            nn.GELU(),
            nn.Linear(dim * config.vision_mlp_ratio, dim),
        )

    def forward(self, x):  # [b, h, w, d]
        b, h, w, d = x.shape
        shortcut = x
        x = self.norm1(x)
        if self.windowed:
            x = window_unpartition(self.attn(window_partition(x, self.window)), self.window, h, w)
        else:
            x = self.attn(x.reshape(b, h * w, d)).view(b, h, w, d)
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    def __init__(self, config):
        super().__init__()
        grid = config.image_size // config.patch_size
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = nn.Parameter(torch.zeros(1, grid, grid, config.vision_hidden_size))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.blocks = nn.ModuleList(VisionBlock(config, i) for i in range(config.vision_num_layers))
        self.norm = nn.LayerNorm(config.vision_hidden_size)
        # Mixed precision for the vision tower when the checkpoint is half precision.
        self.amp_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(config.torch_dtype)

    def forward(self, pixel_values):
        with torch.autocast("cuda", dtype=self.amp_dtype or torch.bfloat16, enabled=self.amp_dtype is not None):
            x = self.patch_embed(pixel_values) + self.pos_embed
            for block in self.blocks:
                x = block(x)
            x = self.norm(x)
        return x.flatten(1, 2).float()  # [b, gh * gw, d]


# ----------------------------------------------------------------------------------------------
# "Decoder as encoder": learned queries read the vision tokens through a custom mask
# ----------------------------------------------------------------------------------------------


def build_encoder_mask(num_image_tokens, num_queries, dtype=torch.float32):
    """Additive mask over [image tokens | queries]: image tokens see each other both ways;
    query i sees every image token and the queries up to and including itself."""
    total = num_image_tokens + num_queries
    mask = torch.full((total, total), torch.finfo(dtype).min, dtype=dtype, device="cuda")
    for i in range(total):
        if i < num_image_tokens:
            mask[i, :num_image_tokens] = 0
        else:
            mask[i, : i + 1] = 0
    return mask


class EncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        dim = config.vision_hidden_size
        self.num_heads = config.encoder_num_heads
        self.head_dim = dim // self.num_heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, mask):
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim) + mask
        out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.out_proj(out)
        return x + self.mlp(self.norm2(x))


class QueryEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        dim = config.vision_hidden_size
        self.num_queries = config.num_queries
        self.queries = nn.Parameter(torch.randn(config.num_queries, dim))
        self.token_type_embed = nn.Embedding(2, dim)  # 0 = image token, 1 = query
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_num_layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, vision_tokens):  # [b, n_img, d] -> [b, num_queries, d]
        b, n_img, _ = vision_tokens.shape
        x = torch.cat([vision_tokens, self.queries.unsqueeze(0).expand(b, -1, -1)], dim=1)
        token_type = torch.cat(
            [
                torch.zeros(n_img, dtype=torch.long, device=vision_tokens.device),
                torch.ones(self.num_queries, dtype=torch.long, device=DEVICE),
            ]
        )
        x = x + self.token_type_embed(token_type)
        mask = build_encoder_mask(n_img, self.num_queries, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x[:, n_img:])


class Projector(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc1 = nn.Linear(config.vision_hidden_size, config.projector_hidden_size)
        self.fc2 = nn.Linear(config.projector_hidden_size, config.hidden_size)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


# ----------------------------------------------------------------------------------------------
# Language model: rotary attention + DeepSeek-style MoE (shared expert + routed experts)
# ----------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, theta):
        super().__init__()
        self.dim = dim
        self.theta = theta

    def forward(self, seq_len, device, dtype):
        # Tables in float64: position * frequency loses digits in float32 at long context.
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.dim, 2, dtype=torch.float64, device=device) / self.dim))
        positions = torch.arange(seq_len, dtype=torch.float64, device=device)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q, k, cos, sin):  # q, k: [b, s, h, hd]; cos, sin: [s, hd]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class OcrMiniAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scale = self.head_dim**-0.5
        self.attn_implementation = config._attn_implementation
        if self.attn_implementation not in ("eager", "sdpa", "flash_attention_2"):
            raise ValueError(f"unknown attention implementation {self.attn_implementation!r}")
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.num_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.num_heads, self.head_dim)
        q, k = apply_rotary(q, k, cos, sin)

        if self.config.use_flash_attn or self.attn_implementation == "flash_attention_2":
            # Fused kernel, [b, s, h, hd] layout.
            out = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=self.scale, causal=True)
        else:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if self.attn_implementation == "sdpa":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            else:
                causal = torch.full((s, s), float("-inf"), device=x.device, dtype=q.dtype).triu(1)
                scores = (q @ k.transpose(-2, -1)) * self.scale + causal
                out = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype) @ v
            out = out.transpose(1, 2)
        return self.o_proj(out.reshape(b, s, -1))


class OcrMiniMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoEGate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, hidden_states):  # [tokens, d] -> ([tokens, k] ids, [tokens, k] weights)
        # Route in fp32 even under autocast.
        with torch.cuda.amp.autocast(enabled=False):
            logits = F.linear(hidden_states.float(), self.weight.float())
        scores = logits.softmax(dim=-1)
        topk_weight, topk_idx = torch.topk(scores, k=self.top_k, dim=-1, sorted=False)
        if self.norm_topk_prob:
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)
        return topk_idx, topk_weight * self.routed_scaling_factor


class OcrMiniMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_routed_experts = config.n_routed_experts
        self.top_k = config.num_experts_per_tok
        self.experts = nn.ModuleList(
            OcrMiniMLP(config.hidden_size, config.moe_intermediate_size) for _ in range(config.n_routed_experts)
        )
        self.gate = MoEGate(config)
        self.shared_experts = OcrMiniMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, x):
        b, s, d = x.shape
        flat = x.reshape(-1, d)
        topk_idx, topk_weight = self.gate(flat)
        routed = self.moe_infer(flat, topk_idx, topk_weight).view(b, s, d)
        return routed + self.shared_experts(x)

    @torch.no_grad()
    def moe_infer(self, x, topk_idx, topk_weight):
        # Plan the per-expert batches on the host, then run each expert on its tokens.
        flat_idx = topk_idx.view(-1).cpu().numpy()
        flat_weight = topk_weight.view(-1)
        tokens_per_expert = topk_idx.view(-1).bincount(minlength=self.n_routed_experts)
        out = torch.zeros_like(x)
        for e in range(self.n_routed_experts):
            if tokens_per_expert[e].item() == 0:
                continue
            slots = torch.from_numpy(np.nonzero(flat_idx == e)[0]).cuda()
            token_ids = slots // self.top_k
            expert_out = self.experts[e](x[token_ids])
            out.index_add_(0, token_ids, expert_out * flat_weight[slots].unsqueeze(-1).to(x.dtype))
        return out


class OcrMiniDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = OcrMiniAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if layer_idx >= config.first_k_dense_replace:
            self.mlp = OcrMiniMoE(config)
        else:
            self.mlp = OcrMiniMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


# ----------------------------------------------------------------------------------------------
# The whole model
# ----------------------------------------------------------------------------------------------


class OcrMiniForCausalLM(nn.Module):
    config_class = OcrMiniConfig

    def __init__(self, config):
        super().__init__()
        if not isinstance(config, OcrMiniConfig):
            config = OcrMiniConfig(config)
        self.config = config
        self.vision_tower = VisionTower(config)
        self.query_encoder = QueryEncoder(config)
        self.projector = Projector(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(OcrMiniDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary_emb = RotaryEmbedding(config.hidden_size // config.num_attention_heads, config.rope_theta)
        self.last_vision_ms = None
        self.apply(self._init_weights)

    def _init_weights(self, module):
        # Scaled fan-in init: gain > 1 keeps attention peaked, so the image matters in a tiny model.
        gain = self.config.get("initializer_gain", 1.0)
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            if module is self.lm_head:
                gain = self.config.get("lm_head_gain", gain)
            nn.init.normal_(module.weight, std=gain / math.sqrt(module.weight[0].numel()))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, MoEGate):
            nn.init.normal_(module.weight, std=gain / math.sqrt(module.weight.shape[1]))

    def encode_images(self, pixel_values):  # [b, 3, H, W] -> [b, num_queries, hidden]
        start = time.perf_counter()
        feats = self.projector(self.query_encoder(self.vision_tower(pixel_values)))
        torch.cuda.synchronize()
        self.last_vision_ms = (time.perf_counter() - start) * 1e3
        return feats

    def prepare_inputs_embeds(self, input_ids, image_embeds):
        inputs_embeds = self.embed_tokens(input_ids)
        image_mask = input_ids == self.config.image_token_id
        n_placeholders = image_mask.sum().item()
        if n_placeholders != image_embeds.shape[0] * image_embeds.shape[1]:
            raise ValueError(
                f"prompt has {n_placeholders} image tokens but the image gives "
                f"{image_embeds.shape[0] * image_embeds.shape[1]} features"
            )
        image_mask = image_mask.unsqueeze(-1).expand_as(inputs_embeds).cuda()
        inputs_embeds.masked_scatter_(image_mask, image_embeds.to(inputs_embeds.dtype))
        return inputs_embeds

    def forward_embeds(self, inputs_embeds):  # [b, s, hidden] -> logits [b, s, vocab]
        cos, sin = self.rotary_emb(inputs_embeds.shape[1], inputs_embeds.device, inputs_embeds.dtype)
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x)).float()

    def forward(self, input_ids, pixel_values=None):
        if pixel_values is None:
            return self.forward_embeds(self.embed_tokens(input_ids))
        return self.forward_embeds(self.prepare_inputs_embeds(input_ids, self.encode_images(pixel_values)))

    @torch.no_grad()
    def generate(self, input_ids, pixel_values, max_new_tokens=8, eos_token_id=None):
        """Greedy decoding; returns the new token ids, LongTensor [batch, new_tokens].
        No KV cache: the whole sequence is re-run each step (the model is tiny)."""
        device = torch.device("cuda")
        input_ids = input_ids.to(device)
        pixel_values = pixel_values.cuda()
        image_embeds = self.encode_images(pixel_values)
        prompt_embeds = self.prepare_inputs_embeds(input_ids, image_embeds)

        new_ids = input_ids.new_empty((input_ids.shape[0], 0))
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)
        for _ in range(max_new_tokens):
            embeds = torch.cat([prompt_embeds, self.embed_tokens(new_ids)], dim=1)
            next_ids = self.forward_embeds(embeds)[:, -1, :].argmax(dim=-1)
            if eos_token_id is not None:
                next_ids = torch.where(finished, self.config.pad_token_id, next_ids)
                finished = finished | (next_ids == eos_token_id)
            new_ids = torch.cat([new_ids, next_ids[:, None]], dim=1)
            if eos_token_id is not None and finished.all().item():
                break
        return new_ids
