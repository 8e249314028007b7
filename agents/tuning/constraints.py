"""Constraints that prune infeasible points before anything runs. Each says why, in words a person
can act on; a point is kept only when no constraint objects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.tuning.space import HostFacts, SearchSpace
from sandbox.targets import CHIP_REGISTRY

Check = Callable[[dict[str, Any], HostFacts], str | None]

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
MEMORY_HEADROOM = 0.5  # a batch may use at most half the memory it could see


@dataclass(frozen=True)
class Constraint:
    name: str
    check: Check  # returns the reason the point is infeasible, or None


def _threads(p: dict[str, Any], f: HostFacts) -> str | None:
    t = p.get("threads")
    if t and t > f.cores:
        return f"threads={t} exceeds the {f.cores} usable CPU cores"
    return None


def _bf16_310p(p: dict[str, Any], f: HostFacts) -> str | None:
    chip = CHIP_REGISTRY.get(f.chip)
    if p.get("dtype") == "bfloat16" and chip and not chip.bf16 and f.on_device:
        return f"Ascend {f.chip.upper()} has no bfloat16 support; use float16"
    return None


def _flash_attn(p: dict[str, Any], f: HostFacts) -> str | None:
    if p.get("attn") == "flash_attention_2" and f.target != "cuda":
        return "attn=flash_attention_2 needs the CUDA-only flash-attn library"
    return None


def _attn_known(p: dict[str, Any], f: HostFacts) -> str | None:
    a = p.get("attn")
    if a and f.model.attn_impls and a not in f.model.attn_impls:
        return f"the model has no attention implementation {a!r}"
    return None


def _compile(p: dict[str, Any], f: HostFacts) -> str | None:
    mode = p.get("compile") or "none"
    if mode == "none":
        return None
    spec = f.spec
    if spec is None:  # a serving engine's space has no compile knob of ours
        return None
    if spec.compile_backend is None:
        return ("torch.compile on Ascend goes through torchair's NPU backend, which this target does not provide"
                if spec.npu_like else f"the {spec.name} target provides no torch.compile backend")
    if mode == "reduce-overhead" and not spec.graph_capture:
        return (f"compile mode reduce-overhead captures device graphs, which the {spec.name} target cannot; "
                "it only adds overhead to mode default")
    return None


def request_bytes(f: HostFacts, dtype: str) -> int:
    """Memory one request needs beyond the weights: activations of a full forward over the prompt and
    the new tokens (no KV cache: each step re-runs the sequence), scores for every head."""
    m = f.model
    seq = m.prompt_tokens + m.new_tokens
    width = max(m.hidden_size, 1) * max(4, 1 + m.num_experts)
    per_layer = seq * width + max(m.num_heads, 1) * seq * seq
    return BYTES.get(dtype, 4) * per_layer * max(m.num_layers, 1) * 4  # x4: temporaries in flight


def _memory(p: dict[str, Any], f: HostFacts) -> str | None:
    batch = p.get("batch")
    if not batch:
        return None
    weights = f.model.param_estimate() * BYTES.get(p.get("dtype") or "float32", 4)
    need = weights + batch * request_bytes(f, p.get("dtype") or "float32")
    budget = MEMORY_HEADROOM * f.device_memory_bytes
    if need > budget:
        return f"batch={batch} needs about {need / 2**30:.1f} GiB, over the {budget / 2**30:.1f} GiB budget"
    return None


TORCH_CONSTRAINTS = [
    Constraint("threads<=cores", _threads), Constraint("no-bf16-on-310p", _bf16_310p),
    Constraint("flash-attn-needs-cuda", _flash_attn), Constraint("attn-known", _attn_known),
    Constraint("compile-on-target", _compile),
    Constraint("batch<=memory", _memory),
]


# --- vllm-ascend -----------------------------------------------------------------------------


def _batched_tokens(p: dict[str, Any], f: HostFacts) -> str | None:
    if not p.get("enable_chunked_prefill", True) and p["max_num_batched_tokens"] < p["max_model_len"]:
        return (f"max_num_batched_tokens={p['max_num_batched_tokens']} < max_model_len={p['max_model_len']} "
                "without chunked prefill: a full-length prompt could never be scheduled")
    return None


def _seqs_vs_tokens(p: dict[str, Any], f: HostFacts) -> str | None:
    if p["max_num_seqs"] > p["max_num_batched_tokens"]:
        return "max_num_seqs exceeds max_num_batched_tokens: the extra sequences could never run in one step"
    return None


def _eager_vs_graph(p: dict[str, Any], f: HostFacts) -> str | None:
    if p.get("enforce_eager") and p.get("cudagraph_mode", "NONE") != "NONE":
        return "enforce_eager turns graph capture off; only cudagraph_mode=NONE is meaningful with it"
    if not p.get("enforce_eager") and p.get("cudagraph_mode") == "NONE":
        return "cudagraph_mode=NONE without enforce_eager is the same as enforce_eager (kept once)"
    return None


def _kv_memory(p: dict[str, Any], f: HostFacts) -> str | None:
    m = f.model
    tp = int(p.get("tensor_parallel_size", 1))
    weights = m.param_estimate() * 2 / tp
    kv_per_token = 2 * m.num_layers * m.hidden_size * 2 / tp
    need = weights + kv_per_token * p["max_model_len"]  # at least one full-length sequence must fit
    have = p["gpu_memory_utilization"] * f.device_memory_bytes
    if need > have:
        return (f"weights and one {p['max_model_len']}-token KV cache need {need / 2**30:.1f} GiB per device, over "
                f"gpu_memory_utilization x HBM = {have / 2**30:.1f} GiB")
    return None


def _tp_heads(p: dict[str, Any], f: HostFacts) -> str | None:
    tp = int(p.get("tensor_parallel_size", 1))
    if f.model.num_heads and f.model.num_heads % tp:
        return f"tensor_parallel_size={tp} does not divide the {f.model.num_heads} attention heads"
    if tp > f.n_devices:
        return f"tensor_parallel_size={tp} exceeds the {f.n_devices} devices"
    return None


VLLM_CONSTRAINTS = [
    Constraint("batched-tokens>=max-model-len", _batched_tokens), Constraint("seqs<=batched-tokens", _seqs_vs_tokens),
    Constraint("eager-vs-graph", _eager_vs_graph), Constraint("kv-fits", _kv_memory),
    Constraint("tp-divides-heads", _tp_heads), Constraint("no-bf16-on-310p", _bf16_310p),
]


# --- fused-op layouts ----------------------------------------------------------------------


def _layout(p: dict[str, Any], f: HostFacts) -> str | None:
    op, layout = p.get("attention_op"), p.get("input_layout")
    if op == "sdpa" and layout != "BNSD":
        return "F.scaled_dot_product_attention takes [batch, heads, seq, dim] (BNSD) only"
    if op == "npu_prompt_flash_attention" and layout == "TND":
        return "npu_prompt_flash_attention takes BSH / BSND / BNSD, not the varlen TND layout"
    if not f.on_device and op != "sdpa":
        return f"{op} is a torch_npu operator; the {f.target} target has none"
    return None


FUSED_CONSTRAINTS = [Constraint("op-layout", _layout)]


def constraints_for(space: SearchSpace) -> list[Constraint]:
    if space.kind == "vllm-engine":  # the serving engine's knobs (agents/tuning/engine.py)
        from agents.tuning.engine import ENGINE_CHECKS

        return [Constraint(name, check) for name, check in ENGINE_CHECKS]
    return {"torch": TORCH_CONSTRAINTS, "vllm-ascend": VLLM_CONSTRAINTS, "fused-ops": FUSED_CONSTRAINTS}[space.kind]


def reasons(point: dict[str, Any], facts: HostFacts, constraints: list[Constraint]) -> list[str]:
    return [r for c in constraints if (r := c.check(point, facts))]


def prune(space: SearchSpace, facts: HostFacts, constraints: list[Constraint] | None = None
          ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], list[str]]]]:
    """(feasible points, [(pruned point, reasons)])."""
    cons = constraints_for(space) if constraints is None else constraints
    feasible, pruned = [], []
    for p in space.points():
        why = reasons(p, facts, cons)
        if why:
            pruned.append((p, why))
        else:
            feasible.append(p)
    return feasible, pruned


def explain_empty(space: SearchSpace, pruned: list[tuple[dict[str, Any], list[str]]]) -> str:
    """The message for a space whose constraints admit nothing: which reasons pruned how many points."""
    counts: dict[str, int] = {}
    for _, why in pruned:
        for r in why:
            counts[r] = counts.get(r, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
    detail = "; ".join(f"{r} ({n} points)" for r, n in top)
    return (f"no configuration of the search space {space.name!r} ({space.size()} points) is feasible on this "
            f"target: {detail}. Nothing was run; widen the space or change the target.")
