"""A tensor-parallel decoder whose embedding table lives on the host and is prefetched on a side stream."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import parallel_state as ps


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        if ps.get_tensor_model_parallel_world_size() == 1:
            return x
        dist.all_reduce(x, group=ps.get_tensor_model_parallel_group())  # HAZARD: collective-call
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class RowParallelLinear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        world = ps.get_tensor_model_parallel_world_size()
        self.weight = nn.Parameter(torch.randn(out_features, in_features // world) * 0.02)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x):
        out = F.linear(x, self.weight)
        out = _ReduceFromModelParallelRegion.apply(out)
        return out + self.bias


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        world = ps.get_tensor_model_parallel_world_size()
        self.weight = nn.Parameter(torch.randn(out_features // world, in_features) * 0.02)

    def forward(self, x):
        return F.linear(x, self.weight)


class HostEmbedding(nn.Module):
    """Embedding rows stay in pinned host memory; the rows a batch needs are copied asynchronously."""

    def __init__(self, num, dim):
        super().__init__()
        self.table = torch.randn(num, dim).pin_memory()  # HAZARD: pin-memory
        self.copy_stream = torch.cuda.Stream()  # HAZARD: torch-cuda-api

    def forward(self, ids, device):
        rows = self.table[ids.cpu()]
        with torch.cuda.stream(self.copy_stream):  # HAZARD: torch-cuda-api
            out = rows.to(device, non_blocking=True)  # HAZARD: non-blocking-copy
        torch.cuda.current_stream().wait_stream(self.copy_stream)  # HAZARD: torch-cuda-api
        out.record_stream(torch.cuda.current_stream())  # HAZARD: torch-cuda-api
        return out


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln = nn.LayerNorm(cfg["hidden"])
        self.up = ColumnParallelLinear(cfg["hidden"], cfg["ffn"])
        self.down = RowParallelLinear(cfg["ffn"], cfg["hidden"])

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.ln(x))))


class TensorParallelLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
        self.device = torch.device("cuda", torch.cuda.current_device())  # HAZARD: cuda-device-string, torch-cuda-api
        self.embed = HostEmbedding(config["vocab_size"], config["hidden"])
        self.blocks = nn.ModuleList(Block(config) for _ in range(config["layers"]))
        self.lm_head = ColumnParallelLinear(config["hidden"], config["vocab_size"])
        self.to(self.device)

    def forward(self, input_ids):
        if not input_ids.is_cuda:  # HAZARD: is-cuda-branch
            input_ids = input_ids.to(self.device, non_blocking=True)  # HAZARD: non-blocking-copy
        h = self.embed(input_ids, self.device)
        for blk in self.blocks:
            h = blk(h)
        return self.lm_head(h)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        out = input_ids
        for _ in range(max_new_tokens):
            nxt = self(out)[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out.to(nxt.device), nxt], dim=1)
        torch.cuda.synchronize()  # HAZARD: torch-cuda-api
        return out.cpu()


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (2, 7), generator=g)}
