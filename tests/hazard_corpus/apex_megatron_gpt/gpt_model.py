"""A small GPT in the Megatron-LM layout (fused layer norm, fused bias-GeLU, fp16 training flags)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fused_kernels import MixedFusedLayerNorm, bias_gelu

torch.backends.cuda.matmul.allow_tf32 = True  # HAZARD: cuda-backend-flags
torch.backends.cudnn.allow_tf32 = True  # HAZARD: cudnn-flags


class ParallelAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads = cfg["num_heads"]
        self.head_dim = cfg["hidden_size"] // cfg["num_heads"]
        self.query_key_value = nn.Linear(cfg["hidden_size"], 3 * cfg["hidden_size"])
        self.dense = nn.Linear(cfg["hidden_size"], cfg["hidden_size"])
        self.norm_factor = math.sqrt(self.head_dim)

    def forward(self, hidden_states, attention_mask):
        b, s, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(b, s, self.num_heads, 3 * self.head_dim)
        q, k, v = qkv.split(self.head_dim, dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.norm_factor
        scores = scores.masked_fill(attention_mask, -10000.0)
        probs = F.softmax(scores.float(), dim=-1).type_as(v)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, -1)
        return self.dense(ctx)


class ParallelMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        self.dense_h_to_4h = nn.Linear(h, 4 * h, bias=False)
        self.bias = nn.Parameter(torch.zeros(4 * h))
        self.dense_4h_to_h = nn.Linear(4 * h, h)

    def forward(self, x):
        return self.dense_4h_to_h(bias_gelu(self.bias, self.dense_h_to_4h(x)))


class ParallelTransformerLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["layernorm_epsilon"]
        self.input_layernorm = MixedFusedLayerNorm(cfg["hidden_size"], eps=eps)
        self.self_attention = ParallelAttention(cfg)
        self.post_attention_layernorm = MixedFusedLayerNorm(cfg["hidden_size"], eps=eps)
        self.mlp = ParallelMLP(cfg)

    def forward(self, x, mask):
        x = x + self.self_attention(self.input_layernorm(x), mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.position_embeddings = nn.Embedding(config["max_position_embeddings"], config["hidden_size"])
        self.layers = nn.ModuleList(ParallelTransformerLayer(config) for _ in range(config["num_layers"]))
        self.final_layernorm = MixedFusedLayerNorm(config["hidden_size"], eps=config["layernorm_epsilon"])
        self.fp16 = config.get("fp16", False)
        if self.fp16:
            self.half()  # HAZARD: fp16-weights

    def forward(self, input_ids):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device).unsqueeze(0)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=input_ids.device), 1)
        with torch.cuda.amp.autocast(enabled=self.fp16):  # HAZARD: cuda-autocast
            h = self.word_embeddings(input_ids) + self.position_embeddings(pos)
            for layer in self.layers:
                h = layer(h, mask)
            h = self.final_layernorm(h)
        return F.linear(h, self.word_embeddings.weight).float()

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        for _ in range(max_new_tokens):
            logits = self(input_ids)[:, -1]
            input_ids = torch.cat([input_ids, logits.argmax(-1, keepdim=True)], dim=1)
        return input_ids


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 8), generator=g)}
