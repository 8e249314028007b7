"""A one-layer transformer that calls xformers attention directly."""
import torch
from torch import nn
import xformers.ops as xops  # HAZARD: cuda-only-import

DEVICE = "cuda"  # HAZARD: cuda-device-string


class Model(nn.Module):
    def __init__(self, config, use_xformers=True):  # HAZARD: kernel-path-flag
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.qkv = nn.Linear(32, 96)
        self.head = nn.Linear(32, config["vocab"])

    def forward(self, ids):
        h = self.emb(ids)
        b, s, _ = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, 4, 8).unbind(2)
        a = xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())  # HAZARD: xformers-attention-call
        return self.head(h + a.reshape(b, s, 32))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids
        out = []
        for _ in range(max_new_tokens):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            out.append(nxt)
        return torch.cat(out, dim=1)


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab"], (1, 6), generator=g)}
