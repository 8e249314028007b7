"""A decoder with a static KV cache whose one-token step is compiled and replayed as a CUDA graph
(the gpt-fast / TensorRT-LLM-style decode loop)."""
import torch
import torch._dynamo
import torch.nn as nn
import torch.nn.functional as F

torch._dynamo.config.cache_size_limit = 64
torch.backends.cuda.enable_flash_sdp(True)  # HAZARD: cuda-backend-flags


class KVCache(nn.Module):
    def __init__(self, max_seq, heads, head_dim, dtype):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, heads, max_seq, head_dim, dtype=dtype))
        self.register_buffer("v", torch.zeros(1, heads, max_seq, head_dim, dtype=dtype))

    def update(self, pos, k, v):
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        return self.k, self.v


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h, self.hd = cfg["n_heads"], cfg["dim"] // cfg["n_heads"]
        self.wqkv = nn.Linear(cfg["dim"], 3 * cfg["dim"], bias=False)
        self.wo = nn.Linear(cfg["dim"], cfg["dim"], bias=False)
        self.cache = KVCache(cfg["max_seq_len"], self.h, self.hd, torch.float32)

    def forward(self, x, pos, mask):
        b, s, d = x.shape
        q, k, v = self.wqkv(x).view(b, s, 3, self.h, self.hd).permute(2, 0, 3, 1, 4)
        k, v = self.cache.update(pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, s, d))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(cfg["dim"]), nn.LayerNorm(cfg["dim"])
        self.attn = Attention(cfg)
        self.ff = nn.Sequential(nn.Linear(cfg["dim"], 4 * cfg["dim"]), nn.GELU(), nn.Linear(4 * cfg["dim"], cfg["dim"]))

    def forward(self, x, pos, mask):
        x = x + self.attn(self.n1(x), pos, mask)
        return x + self.ff(self.n2(x))


class StaticCacheDecoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.cfg = config
        self.tok = nn.Embedding(config["vocab_size"], config["dim"])
        self.layers = nn.ModuleList(Layer(config) for _ in range(config["n_layers"]))
        self.out = nn.Linear(config["dim"], config["vocab_size"], bias=False)
        causal = torch.tril(torch.ones(config["max_seq_len"], config["max_seq_len"], dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)
        self._graph = None
        free, total = torch.cuda.mem_get_info()  # HAZARD: torch-cuda-api
        self.max_batch = max(1, int(free // (64 * 1024 * 1024)))
        if config.get("compile"):
            self.decode_one = torch.compile(self.decode_one, mode="reduce-overhead", fullgraph=True)  # HAZARD: compile-graph-mode

    def step(self, tokens, pos):
        mask = self.causal[pos][None, None]
        h = self.tok(tokens)
        for layer in self.layers:
            h = layer(h, pos, mask)
        return self.out(h)

    def decode_one(self, token, pos):
        return self.step(token, pos)

    def _capture(self, token, pos):
        self._static_tok, self._static_pos = token.clone(), pos.clone()
        s = torch.cuda.Stream()  # HAZARD: torch-cuda-api
        s.wait_stream(torch.cuda.current_stream())  # HAZARD: torch-cuda-api
        with torch.cuda.stream(s):  # HAZARD: torch-cuda-api
            for _ in range(2):
                self.step(self._static_tok, self._static_pos)
        torch.cuda.current_stream().wait_stream(s)  # HAZARD: torch-cuda-api
        self._graph = torch.cuda.CUDAGraph()  # HAZARD: cuda-graph, torch-cuda-api
        with torch.cuda.graph(self._graph):  # HAZARD: cuda-graph, torch-cuda-api
            self._static_out = self.step(self._static_tok, self._static_pos)

    @torch.inference_mode()
    def generate(self, input_ids, max_new_tokens=5):
        for layer in self.layers:
            layer.attn.cache.k.zero_()
            layer.attn.cache.v.zero_()
        n = input_ids.shape[1]
        logits = self.step(input_ids, torch.arange(n, device=input_ids.device))
        nxt = logits[:, -1:].argmax(-1)
        out = [nxt]
        for i in range(max_new_tokens - 1):
            pos = torch.tensor([n + i], device=input_ids.device)
            if self.cfg.get("use_cuda_graph"):
                if self._graph is None:
                    self._capture(nxt, pos)
                self._static_tok.copy_(nxt)
                self._static_pos.copy_(pos)
                self._graph.replay()
                logits = self._static_out
            else:
                logits = self.decode_one(nxt, pos)
            nxt = logits[:, -1:].argmax(-1)
            out.append(nxt)
        return torch.cat(out, dim=1)


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 6), generator=g)}
