"""Configuration flags that pick fused kernels."""
import torch
from torch import nn

triton_enabled = True  # HAZARD: kernel-path-flag


class Model(nn.Module):
    def __init__(self, config, fused_rmsnorm=True):  # HAZARD: kernel-path-flag
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, config["vocab"])
        self.use_fused = fused_rmsnorm and triton_enabled and torch.cuda.is_available()  # HAZARD: torch-cuda-api

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(self.norm(h))

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
