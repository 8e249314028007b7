"""The projection: vLLM serving a model (``ModelCost``) on a machine (``Hardware``) with an engine efficiency
(``Efficiency``), per concurrency.

A decode step of b running requests, each with c tokens of context, on one card of a tensor-parallel group
of t cards:
- FLOPs: b x (2 x active parameters + attention FLOPs per context token x c), plus the prompt tokens and
  images the step prefills (chunked prefill: per generated token, input/output of them) / t;
- bytes: the weights a step reads (all dense weights; of a MoE layer's routed experts, the share a batch of
  tokens touches, E x (1 - (1 - k/E)^tokens) experts), plus b x c tokens of KV cache; / t (a latent MLA
  cache is whole on every card, a GQA cache splits by at most its KV heads);
- time: the larger of FLOPs / (peak x compute share) and bytes / (bandwidth x bandwidth share), plus the
  host's part (per layer, graph mode or eager; per sequence), two all-reduces per layer when t > 1, and the
  model's own host syncs and CPU fallbacks per step where the serving runs its code.
TPOT is that step; TTFT is the prompt's prefill alone (and its images through the encoder) plus one step; a
closed loop of n clients gives n x output / (TTFT + (output - 1) x TPOT) tokens per second. The bound of a
figure is the largest part of its time; "memory" when the KV cache holds fewer requests than the
concurrency asked for (the rest queue).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from agents.projection.cost import ModelCost
from agents.projection.engine import Efficiency
from agents.projection.hardware import WEIGHT_BYTES, Hardware

KV_BYTES = 2.0  # the KV cache in the half-precision dtype (vLLM's default kv-cache-dtype auto)
SYNC_MS = 0.05
"""A host sync inside the step: the device queue drains before the host reads (an assumed figure, no
published one); it also rules graph capture out."""
FALLBACK_MS = 0.3
"""A CPU fallback: the tensor to the host, the op there, the result back (assumed, as SYNC_MS)."""
BOUNDS = {"compute": "compute", "bandwidth": "HBM bandwidth", "host": "host/launch overhead",
          "interconnect": "interconnect (tensor-parallel all-reduce)", "syncs": "host syncs / CPU fallbacks"}


class Deployment(BaseModel):
    cards: int = 1
    """Tensor-parallel size: the cards one copy of the model spans."""
    replicas: int = 1
    """Data-parallel copies (each with ``cards`` cards); published figures use it, the CLI serves one."""
    dtype: str = "bfloat16"
    expert_dtype: str | None = None
    """The routed experts' weights when they are stored narrower than the rest (int4 experts)."""
    graph_mode: bool = True
    gpu_memory_utilization: float = 0.9


class Workload(BaseModel):
    concurrency: list[int] = Field(default_factory=lambda: [1, 8, 32, 100])
    input_len: int = 1024
    output_len: int = 256
    images: int = 0
    """Images per request (each through the encoder, its tokens added to the prompt)."""


class HostCosts(BaseModel):
    """The model's own host syncs and CPU fallbacks per decode step (the port's op inventory)."""

    syncs_per_step: float = 0.0
    fallbacks_per_step: float = 0.0
    applies: bool = False
    """The serving runs the model's own code (vLLM's Transformers backend); vLLM's own class does not."""
    source: str = "no op inventory"


class Row(BaseModel):
    concurrency: int
    running: int
    """Requests the KV cache holds at once (the rest queue)."""
    output_tok_s: float
    output_tok_s_per_card: float
    ttft_ms: float
    tpot_ms: float
    bound: str
    parts_ms: dict[str, float] = Field(default_factory=dict)
    """The decode step's time by part (compute, bandwidth, host, interconnect, syncs)."""


class Memory(BaseModel):
    weights_gib_per_card: float
    reserve_gib_per_card: float
    kv_budget_gib_per_card: float
    kv_bytes_per_token_per_card: float
    kv_per_request_mib: float
    """Per card, for a request of input + output tokens (its images' tokens included)."""
    max_concurrency: int
    """Requests the KV cache holds at once at this length; 0: the weights do not fit."""
    fits: bool
    cards_needed: int
    """The fewest cards (a power of two within a node) whose memory holds the weights and one request."""
    note: str = ""


class Projection(BaseModel):
    chip: str
    cards: int
    dtype: str
    graph_mode: bool
    rows: list[Row]
    memory: Memory
    input_len: int
    output_len: int
    images: int = 0
    model_source: str = ""
    efficiency: str = ""
    host_costs: str = ""
    notes: list[str] = Field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        """The CLI's --json: exactly issue 44's schema."""
        return {"chip": self.chip, "cards": self.cards, "dtype": self.dtype, "graph_mode": self.graph_mode,
                "rows": [{"concurrency": r.concurrency, "output_tok_s": round(r.output_tok_s, 2),
                          "output_tok_s_per_card": round(r.output_tok_s_per_card, 2), "ttft_ms": round(r.ttft_ms, 2),
                          "tpot_ms": round(r.tpot_ms, 2), "bound": r.bound} for r in self.rows],
                "memory": self.memory.model_dump()}


def _weight_bytes(cost: ModelCost, dep: Deployment, experts_fraction: float) -> float:
    """Bytes of weights one step reads: dense active weights whole, routed experts by the touched share."""
    wb = WEIGHT_BYTES[dep.dtype]
    eb = WEIGHT_BYTES[dep.expert_dtype or dep.dtype]
    dense = cost.active_params - sum(k.expert_params * k.top_k / max(k.experts, 1) for k in cost.moe_kinds())
    routed = sum(k.expert_params for k in cost.moe_kinds())
    return dense * wb + routed * experts_fraction * eb


def _touched(cost: ModelCost, tokens: float) -> float:
    """Share of the routed experts a step of ``tokens`` tokens reads (tokens route independently)."""
    moe = cost.moe_kinds()
    if not moe or tokens <= 0:
        return 0.0
    k = moe[0]
    share = k.top_k / max(k.experts, 1)
    return 1.0 - (1.0 - share) ** tokens


def _kv_split(cost: ModelCost, cards: int) -> float:
    att = cost.attention()
    if att is None or cards <= 1:
        return 1.0
    if not att.kv_shardable:
        return 1.0
    return float(min(cards, max(att.kv_heads, 1))) if att.kv_heads else float(cards)


def step_parts(cost: ModelCost, hw: Hardware, eff: Efficiency, dep: Deployment, host: HostCosts, *,
               decode: float, ctx: float, prefill_tokens: float = 0.0, prefill_ctx: float = 0.0,
               images: float = 0.0) -> dict[str, float]:
    """One engine step's time by part, in ms, on one card."""
    t = max(dep.cards, 1)
    tokens = decode + prefill_tokens
    flops = (tokens * 2.0 * cost.active_params + decode * ctx * cost.attn_flops_per_ctx
             + prefill_tokens * prefill_ctx * cost.attn_flops_per_ctx
             + images * (cost.encoder.flops_per_image if cost.encoder else 0.0)) / t
    experts = _touched(cost, tokens)
    weights = _weight_bytes(cost, dep, experts) + (cost.encoder.params * 2.0 if cost.encoder and images else 0.0)
    kv = (decode * ctx + prefill_tokens * prefill_ctx / 2) * cost.kv_elems_per_token * KV_BYTES / _kv_split(cost, t)
    parts = {"compute": flops / (hw.peak(dep.dtype) * eff.compute) * 1e3,
             "bandwidth": (weights / t + kv) / (hw.hbm_gbps * 1e9 * eff.bandwidth) * 1e3,
             "host": cost.layers * eff.layer_ms(dep.graph_mode and not host_breaks_graph(host))
             + (decode + (1 if prefill_tokens else 0)) * eff.seq_ms,
             "interconnect": 0.0, "syncs": 0.0}
    if t > 1:
        volume = tokens * cost.hidden * 2.0 * 2 * (t - 1) / t  # bytes each card sends per all-reduce
        per = eff.allreduce_ms + (volume / (hw.interconnect_gbps * 1e9) * 1e3 if hw.interconnect_gbps else 0.0)
        parts["interconnect"] = 2 * cost.layers * per
    if host.applies:
        parts["syncs"] = host.syncs_per_step * SYNC_MS + host.fallbacks_per_step * FALLBACK_MS
    return parts


def host_breaks_graph(host: HostCosts) -> bool:
    """A host sync inside the step cannot be captured in a graph: the step runs eager."""
    return host.applies and host.syncs_per_step > 0


def step_ms(parts: dict[str, float]) -> float:
    return max(parts["compute"], parts["bandwidth"]) + parts["host"] + parts["interconnect"] + parts["syncs"]


def bound_of(parts: dict[str, float]) -> str:
    roof = "compute" if parts["compute"] >= parts["bandwidth"] else "bandwidth"
    rest = {k: v for k, v in parts.items() if k not in ("compute", "bandwidth")}
    top = max(rest, key=lambda k: rest[k])
    return BOUNDS[roof if parts[roof] >= rest[top] else top]


def memory_of(cost: ModelCost, hw: Hardware, eff: Efficiency, dep: Deployment, wl: Workload) -> Memory:
    t = max(dep.cards, 1)
    wb, eb = WEIGHT_BYTES[dep.dtype], WEIGHT_BYTES[dep.expert_dtype or dep.dtype]
    routed = sum(k.expert_params for k in cost.moe_kinds())
    weights = ((cost.params - routed) * wb + routed * eb) / t
    kv_token = cost.kv_elems_per_token * KV_BYTES / _kv_split(cost, t)
    seq = wl.input_len + wl.output_len + wl.images * (cost.encoder.output_tokens if cost.encoder else 0)
    budget = dep.gpu_memory_utilization * hw.hbm_gib * 2**30 - weights - eff.reserve_gib * 2**30
    per_request = kv_token * seq
    fits = budget > per_request > 0 or (budget > 0 and per_request == 0)
    most = int(budget // per_request) if per_request > 0 and budget > 0 else (10**6 if budget > 0 else 0)
    needed = cards_for(cost, hw, eff, dep, seq)
    note = "" if fits else (f"the weights ({weights / 2**30:.1f} GiB per card) and the runtime's "
                            f"{eff.reserve_gib:.1f} GiB leave no room for one request's KV cache in "
                            f"{dep.gpu_memory_utilization:g} x {hw.hbm_gib:g} GiB: {needed} card(s) would")
    return Memory(weights_gib_per_card=round(weights / 2**30, 3), reserve_gib_per_card=round(eff.reserve_gib, 2),
                  kv_budget_gib_per_card=round(max(budget, 0.0) / 2**30, 3),
                  kv_bytes_per_token_per_card=round(kv_token, 1), kv_per_request_mib=round(per_request / 2**20, 3),
                  max_concurrency=most if fits else 0, fits=fits, cards_needed=needed, note=note)


def cards_for(cost: ModelCost, hw: Hardware, eff: Efficiency, dep: Deployment, seq: int, running: int = 1) -> int:
    """The fewest cards (a power of two, at most a node's) whose memory holds the weights, the runtime and
    ``running`` requests of ``seq`` tokens; a node's count when even that does not."""
    wb, eb = WEIGHT_BYTES[dep.dtype], WEIGHT_BYTES[dep.expert_dtype or dep.dtype]
    routed = sum(k.expert_params for k in cost.moe_kinds())
    weights = (cost.params - routed) * wb + routed * eb
    usable = dep.gpu_memory_utilization * hw.hbm_gib * 2**30 - eff.reserve_gib * 2**30
    n = 1
    while n < hw.cards_per_node:
        kv = cost.kv_elems_per_token * KV_BYTES / _kv_split(cost, n) * seq * running
        if weights / n + kv <= usable:
            break
        n *= 2
    return n


def row_at(cost: ModelCost, hw: Hardware, eff: Efficiency, dep: Deployment, wl: Workload, host: HostCosts,
           concurrency: int, memory: Memory) -> Row:
    running = max(1, min(concurrency, memory.max_concurrency)) if memory.fits else concurrency
    image_tokens = wl.images * (cost.encoder.output_tokens if cost.encoder else 0)
    prompt = wl.input_len + image_tokens
    out = max(wl.output_len, 1)
    decode = float(running)
    ctx = prompt + out / 2
    prefill_share = running * prompt / out  # chunked prefill: the prompt tokens entering per step
    parts = step_parts(cost, hw, eff, dep, host, decode=decode, ctx=ctx, prefill_tokens=prefill_share,
                       prefill_ctx=prompt / 2, images=running * wl.images / out)
    tpot = step_ms(parts)
    first = step_parts(cost, hw, eff, dep, host, decode=0.0, ctx=0.0, prefill_tokens=prompt, prefill_ctx=prompt / 2,
                       images=wl.images)
    ttft = step_ms(first) + tpot
    total_s = (ttft + (out - 1) * tpot) / 1e3
    tok_s = running * out / total_s * dep.replicas
    bound = bound_of(first) if ttft > (out - 1) * tpot else bound_of(parts)
    if memory.fits and running < concurrency:
        bound = "memory (KV cache)"
    if not memory.fits:  # it does not run: the step times are what the arithmetic would give, no throughput
        bound, tok_s = "memory (weights)", 0.0
    return Row(concurrency=concurrency, running=running, output_tok_s=tok_s,
               output_tok_s_per_card=tok_s / (max(dep.cards, 1) * dep.replicas), ttft_ms=ttft, tpot_ms=tpot,
               bound=bound, parts_ms={k: round(v, 3) for k, v in parts.items()})


def project(cost: ModelCost, hw: Hardware, eff: Efficiency, dep: Deployment, wl: Workload,
            host: HostCosts | None = None) -> Projection:
    host = host or HostCosts()
    memory = memory_of(cost, hw, eff, dep, wl)
    rows = [row_at(cost, hw, eff, dep, wl, host, c, memory) for c in wl.concurrency]
    notes = list(cost.notes)
    if host_breaks_graph(host) and dep.graph_mode:
        notes.append(f"graph mode asked, but the model's code syncs with the host {host.syncs_per_step:g} time(s) per "
                     "step: the step cannot be captured and is projected eager")
    if cost.encoder and wl.images and not cost.encoder.flops_per_image:
        notes.append("the encoder's cost per image is unknown: images add their tokens to the prompt only")
    if math.isclose(eff.compute, 1.0) and not hw.measured:
        notes.append("the compute share reached its bound (1.0): the published figures ask for more than the peak")
    return Projection(chip=hw.name, cards=dep.cards, dtype=dep.dtype, graph_mode=dep.graph_mode, rows=rows,
                      memory=memory, input_len=wl.input_len, output_len=wl.output_len, images=wl.images,
                      model_source=cost.source, efficiency=eff.note, host_costs=host.source, notes=notes)
