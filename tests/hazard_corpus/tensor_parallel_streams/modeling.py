"""A column-parallel MLP with a side stream, pinned staging and collectives."""
import torch
import torch.distributed as dist
from torch import nn


def init_parallel():
    dist.init_process_group("nccl")  # HAZARD: nccl-backend


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.fc = nn.Linear(32, 32)
        self.head = nn.Linear(32, config["vocab"])
        self.side = torch.cuda.Stream()  # HAZARD: torch-cuda-api

    def forward(self, ids):
        ids = ids.pin_memory()  # HAZARD: pin-memory
        ids = ids.to("cuda", non_blocking=True)  # HAZARD: cuda-device-string, non-blocking-copy
        with torch.cuda.stream(self.side):  # HAZARD: torch-cuda-api
            h = self.fc(self.emb(ids))
        torch.cuda.current_stream().wait_stream(self.side)  # HAZARD: torch-cuda-api
        if dist.is_initialized():
            dist.all_reduce(h)  # HAZARD: collective-call
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
