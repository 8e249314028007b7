"""Rotary embeddings in complex numbers and an optional 8-bit optimizer."""
import torch
from torch import nn
import bitsandbytes as bnb  # HAZARD: unused-cuda-only-import


def rotary(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # HAZARD: complex-dtype
    return torch.view_as_real(xc * freqs).flatten(-2).type_as(x)  # HAZARD: complex-dtype


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.head = nn.Linear(32, config["vocab"])
        t = torch.arange(64).float()[:, None] * (1.0 / 10000 ** (torch.arange(16).float() / 16))
        self.register_buffer("freqs", torch.polar(torch.ones_like(t), t), persistent=False)  # HAZARD: complex-dtype

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(rotary(h, self.freqs[: h.shape[1]]))

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
