"""Times its forward pass with CUDA events."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.head = nn.Linear(32, config["vocab"])
        self.last_ms = 0.0

    def forward(self, ids):
        start = torch.cuda.Event(enable_timing=True)  # HAZARD: torch-cuda-api
        end = torch.cuda.Event(enable_timing=True)  # HAZARD: torch-cuda-api
        start.record()
        out = self.head(self.emb(ids).cuda())  # HAZARD: cuda-call
        end.record()
        torch.cuda.synchronize()  # HAZARD: torch-cuda-api
        self.last_ms = start.elapsed_time(end)
        return out

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
