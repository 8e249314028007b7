"""A gated MLP with an optional Triton activation kernel."""
import torch
from torch import nn
import triton  # HAZARD: cuda-only-import
import triton.language as tl  # HAZARD: cuda-only-import
HAS_TRITON = True


@triton.jit  # HAZARD: triton-kernel
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 32)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)
        self.head = nn.Linear(32, config["vocab"])

    def act(self, x):
        if HAS_TRITON and x.is_cuda:  # HAZARD: is-cuda-branch
            y = torch.empty_like(x)
            _gelu_kernel[(1,)](x, y, x.numel(), BLOCK=64)
            return y
        return torch.nn.functional.gelu(x)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.down(self.act(self.up(h)))
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
