"""Sizes its cache from the device and keeps an fp16 copy for serving."""
import torch
from torch import nn


def to_serving(model):
    return model.half()  # HAZARD: fp16-weights


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert torch.cuda.is_available(), "needs a GPU"  # HAZARD: torch-cuda-api
        props = torch.cuda.get_device_properties(0)  # HAZARD: torch-cuda-api
        self.cache_tokens = max(16, props.total_memory // (1 << 30))
        self.emb = nn.Embedding(config["vocab"], 32)
        self.head = nn.Linear(32, config["vocab"])

    def forward(self, ids):
        return self.head(self.emb(ids)[:, -self.cache_tokens:])

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
