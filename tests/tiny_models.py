"""Tiny model folders written by tests: a manifest, a config and a modeling file with a twist."""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = """name: tiny
entry:
  class: modeling_tiny:TinyLM
config: config.json
inputs: modeling_tiny:make_inputs
run:
  method: generate
  kwargs: {max_new_tokens: 4}
"""

CUDA_TINY = '''import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 16)
        self.head = nn.Linear(16, config["vocab"])

    def forward(self, ids):
        return self.head(self.emb(ids))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids.cuda()
        out = []
        for _ in range(max_new_tokens):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            {TWIST}
            ids = torch.cat([ids, nxt], dim=1)
            out.append(nxt)
        return torch.cat(out, dim=1)


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab"], (1, 5), generator=g)}
'''


def write_tiny_model(root: Path, twist: str = "pass") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "npuport.yaml").write_text(MANIFEST)
    (root / "config.json").write_text(json.dumps({"vocab": 32}))
    (root / "modeling_tiny.py").write_text(CUDA_TINY.replace("{TWIST}", twist))
    return root
