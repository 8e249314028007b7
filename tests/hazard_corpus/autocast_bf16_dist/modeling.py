"""bf16 autocast on CUDA and a data-parallel reduction of statistics."""
import torch
import torch.distributed as dist
from torch import nn


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.head = nn.Linear(32, config["vocab"])

    def forward(self, ids):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=False):  # HAZARD: cuda-autocast
            h = self.emb(ids)
            stats = h.mean()
            if dist.is_initialized():
                dist.all_reduce(stats)  # HAZARD: collective-call
            return self.head(h - stats)

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
