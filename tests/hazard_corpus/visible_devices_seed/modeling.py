"""Picks its GPU from the environment and seeds CUDA."""
import os

import torch
from torch import nn

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")  # HAZARD: cuda-visible-devices


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        torch.cuda.manual_seed(0)  # HAZARD: torch-cuda-api
        self.emb = nn.Embedding(config["vocab"], 32)
        self.head = nn.Linear(32, config["vocab"])

    def forward(self, ids):
        h = self.emb(ids.to(torch.device("cuda")))  # HAZARD: cuda-device-string
        return self.head(h)

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
