"""Switch/Mixtral-style sparse MoE with capacity-limited top-k routing and load-balancing statistics."""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1 = nn.Linear(d, 2 * d, bias=False)
        self.w2 = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TopKRouter(nn.Module):
    def __init__(self, d, num_experts, top_k, capacity_factor):
        super().__init__()
        self.gate = nn.Linear(d, num_experts, bias=False)
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor

    def forward(self, x):
        logits = self.gate(x)
        probs = logits.softmax(dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        tokens_per_expert = torch.bincount(experts.flatten(), minlength=self.num_experts)  # HAZARD: dynamic-shape-sync
        if dist.is_initialized():
            dist.all_reduce(tokens_per_expert)  # HAZARD: collective-call
        capacity = int(self.capacity_factor * x.shape[0] * self.top_k / self.num_experts) + 1
        aux_loss = (probs.mean(0) * tokens_per_expert.float() / experts.numel()).sum() * self.num_experts
        return weights, experts, capacity, aux_loss


class SparseMoEBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.norm = nn.LayerNorm(d)
        self.router = TopKRouter(d, cfg["num_experts"], cfg["top_k"], cfg["capacity_factor"])
        self.experts = nn.ModuleList(Expert(d) for _ in range(cfg["num_experts"]))

    def forward(self, hidden):
        shape = hidden.shape
        x = self.norm(hidden).reshape(-1, shape[-1])
        weights, experts, capacity, aux = self.router(x)
        flat_experts = experts.flatten()
        order = flat_experts.argsort(stable=True)
        counts = torch.bincount(flat_experts, minlength=len(self.experts)).tolist()  # HAZARD: dynamic-shape-sync, tolist-sync
        token_idx = order // experts.shape[1]
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts):  # HAZARD: per-expert-loop
            if n == 0:
                continue
            sel = order[start:start + min(n, capacity)]
            rows = token_idx[start:start + min(n, capacity)]
            y = self.experts[e](x[rows]) * weights.flatten()[sel, None]
            out.index_add_(0, rows, y)
            start += n
        self.aux_loss = aux
        return hidden + out.view(shape)


class SparseMoELM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config["vocab_size"], config["d_model"])
        self.layers = nn.ModuleList(SparseMoEBlock(config) for _ in range(config["num_layers"]))
        self.lm_head = nn.Linear(config["d_model"], config["vocab_size"], bias=False)

    def forward(self, input_ids):
        torch.cuda.nvtx.range_push("moe_forward")  # HAZARD: torch-cuda-api
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        torch.cuda.nvtx.range_pop()  # HAZARD: torch-cuda-api
        return self.lm_head(h)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        for _ in range(max_new_tokens):
            nxt = self(input_ids)[:, -1].argmax(-1, keepdim=True)
            input_ids = torch.cat([input_ids, nxt], dim=-1)
        return input_ids


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (2, 6), generator=g)}
