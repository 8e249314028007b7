"""A decoder step compiled with CUDA-graph capture."""
import torch
from torch import nn


def capture(step, example):
    g = torch.cuda.CUDAGraph()  # HAZARD: cuda-graph, torch-cuda-api
    with torch.cuda.graph(g):  # HAZARD: cuda-graph, torch-cuda-api
        out = step(example)
    return g, out


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.block = torch.compile(nn.Linear(32, 32), mode="reduce-overhead")  # HAZARD: compile-graph-mode
        self.head = nn.Linear(32, config["vocab"])

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(h + torch.tanh(self.block(h)))

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
