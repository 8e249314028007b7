"""Top-2 mixture-of-experts routing with load statistics."""
import torch
from torch import nn

torch.backends.cuda.matmul.allow_tf32 = True  # HAZARD: cuda-backend-flags


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.router = nn.Linear(32, 4)
        self.experts = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.head = nn.Linear(32, config["vocab"])

    def forward(self, ids):
        h = self.emb(ids)
        flat = h.reshape(-1, 32)
        w, idx = self.router(flat).softmax(-1).topk(2, dim=-1)
        self.load = torch.bincount(idx.flatten(), minlength=4)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            out.index_add_(0, rows, expert(flat[rows]) * w[rows, slot, None])
        torch.cuda.synchronize()  # HAZARD: torch-cuda-api
        return self.head(h + out.view_as(h))

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
