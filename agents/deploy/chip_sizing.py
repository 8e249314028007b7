"""serve.sh sized for the chip: the settings that matter most on an NPU, chosen from the projection of the
full-size model on the port's chip (agents/projection) wherever the vendor recipe does not set them.

What each setting's source stays: a setting the vendor recipe sets (the vllm-ascend serving doc the
knowledge base matched, ``source == "knowledge base"``) is kept as written; what the real-NPU loop measured
(``tuned``) and the engine tuner's knobs measured on this host (``engine_*``) are kept and stay marked as
measured. The rest is set or replaced here, with ``source="projected"`` and a reason naming the figures that
decided it: tensor-parallel size (the fewest cards whose memory holds the weights, the runtime and the
requests), max-num-seqs (the smallest concurrency within 5% of the best projected throughput that the KV
cache holds), max-model-len (the model's own length, cut to what eight requests' KV cache can hold),
gpu-memory-utilization (vLLM's default, with the KV cache it leaves) and graph mode vs eager.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.deploy.vllm import NOT_MEASURED, ServeSetting
from agents.projection.project import Deployment, Projection, Workload, cards_for, memory_of, project
from agents.projection.render import count_text
from knowledge.untrusted import number_value

PROJECTED = "projected"
CITATION = "npuport projection (agents/projection; docs/deploy.md, Projected on a chip)"
MEASURED = f"{NOT_MEASURED}: projected from published figures"
SEQ_CANDIDATES = (8, 16, 32, 64, 128, 256, 512)
THROUGHPUT_SHARE = 0.95
MIN_REQUESTS_AT_MAX_LEN = 8
DEFAULT_UTILIZATION = 0.9


def _kept(s: ServeSetting) -> bool:
    """A setting the vendor recipe set or a measurement decided: never replaced."""
    return s.source in ("knowledge base", "tuned") or s.kind.startswith("engine_")


def _set(settings: list[ServeSetting], name: str, value: Any, reason: str, kind: str = "flag") -> None:
    existing = next((s for s in settings if s.name == name and s.kind in ("flag", "decision")), None)
    if existing is not None and _kept(existing):
        return
    new = ServeSetting(name=name, value=value, kind=kind, reason=reason, citation=CITATION, source=PROJECTED,
                       measured=MEASURED)
    if existing is None:
        settings.append(new)
    else:
        settings[settings.index(existing)] = new


def _value(settings: list[ServeSetting], name: str) -> Any:
    return next((s.value for s in settings if s.name == name and s.kind == "flag"), None)


def size_for_chip(settings: list[ServeSetting], state: Mapping[str, Any], model_dir: Path | None) -> list[ServeSetting]:
    """``settings`` with the projection's choices for the port's chip; unchanged (and a note in deploy.json's
    reasons) when the model cannot be projected."""
    from agents.projection.model_source import from_state
    from agents.projection.projector import project_source

    source = from_state(state, model_dir)
    if source is None:
        return settings
    try:
        base, cost = project_source(source, build_env=False)
    except Exception:  # serve.sh is written whatever the projection does (unsized, as before)
        return settings
    from agents.projection.hardware import chip_hardware
    from agents.projection.published import calibrated

    out = list(settings)
    hw, eff = chip_hardware(base.chip), calibrated()
    # a setting's value may come from a serving doc (the knowledge base): a fraction, else the default
    util = number_value(_value(out, "gpu-memory-utilization"), DEFAULT_UTILIZATION, 0.01, 1.0)
    dep = Deployment(dtype=base.dtype, graph_mode=True, gpu_memory_utilization=util)
    wl = Workload(concurrency=list(SEQ_CANDIDATES), input_len=base.input_len, output_len=base.output_len,
                  images=base.images)
    image_tokens = wl.images * (cost.encoder.output_tokens if cost.encoder else 0)
    cards = cards_for(cost, hw, eff, dep, wl.input_len + wl.output_len + image_tokens)
    dep = dep.model_copy(update={"cards": cards})
    mem = memory_of(cost, hw, eff, dep, wl)
    _set(out, "tensor-parallel-size", cards,
         f"on {hw.name}: {count_text(cost.params)} parameters in {dep.dtype} are {mem.weights_gib_per_card:.1f} "
         f"GiB per card at {cards} card(s), beside the runtime's {eff.reserve_gib:.1f} GiB: the fewest cards (a power "
         f"of two) whose {util:g} x {hw.hbm_gib:g} GiB holds them and a request")
    sized = project(cost, hw, eff, dep, wl, source.host)
    _size_seqs(out, sized, mem.max_concurrency, hw.name)
    _size_len(out, cost, hw, eff, dep, wl)
    _set(out, "gpu-memory-utilization", util,
         f"vLLM's default share; it leaves {mem.kv_budget_gib_per_card:.1f} GiB of KV cache per card on {hw.name} "
         f"({mem.max_concurrency} requests of {wl.input_len}+{wl.output_len} tokens)")
    _graph_mode(out, cost, hw, eff, dep, wl, source.host)
    return out


def _size_seqs(out: list[ServeSetting], sized: Projection, fits: int, chip: str) -> None:
    rows = [r for r in sized.rows if r.concurrency <= max(fits, 1)] or sized.rows[:1]
    best = max(r.output_tok_s for r in rows)
    pick = next(r for r in rows if r.output_tok_s >= THROUGHPUT_SHARE * best)
    _set(out, "max-num-seqs", pick.concurrency,
         f"projected on {chip}: {pick.output_tok_s:.0f} output tok/s at {pick.concurrency} requests, within "
         f"{100 - THROUGHPUT_SHARE * 100:.0f}% of the best of {', '.join(str(r.concurrency) for r in rows)} "
         f"({best:.0f} tok/s; TPOT {pick.tpot_ms:.1f} ms, bound: {pick.bound}); the KV cache holds {fits}")


def _size_len(out: list[ServeSetting], cost: Any, hw: Any, eff: Any, dep: Deployment, wl: Workload) -> None:
    own = int(number_value(_value(out, "max-model-len"), 0, 1, 2**31) or cost.max_len or 0)
    if not own:
        return
    mem = memory_of(cost, hw, eff, dep, Workload(input_len=own, output_len=0, images=0))
    if mem.max_concurrency >= MIN_REQUESTS_AT_MAX_LEN:
        length, why = own, f"the model's own length; its KV cache holds {mem.max_concurrency} requests that long"
    else:
        per_token = max(mem.kv_bytes_per_token_per_card, 1.0)
        length = int(mem.kv_budget_gib_per_card * 2**30 / per_token / MIN_REQUESTS_AT_MAX_LEN) // 256 * 256
        length = max(min(length, own), 256)
        why = (f"the model's own {own} tokens would fit {mem.max_concurrency} request(s) in the "
               f"{mem.kv_budget_gib_per_card:.1f} GiB KV cache per card: cut to hold {MIN_REQUESTS_AT_MAX_LEN}")
    _set(out, "max-model-len", length, f"on {hw.name}: {why}")


def _graph_mode(out: list[ServeSetting], cost: Any, hw: Any, eff: Any, dep: Deployment, wl: Workload,
                host: Any) -> None:
    """vLLM captures graphs by default; eager (--enforce-eager) only where the projection says graph mode
    cannot hold (the model's own host syncs in the step) or would be slower."""
    one = Workload(concurrency=[8], input_len=wl.input_len, output_len=wl.output_len, images=wl.images)
    vllm_own = host.model_copy(update={"applies": False})  # vLLM's own class: the model's syncs do not run
    graph = project(cost, hw, eff, dep, one, vllm_own).rows[0]
    eager = project(cost, hw, eff, dep.model_copy(update={"graph_mode": False}), one, vllm_own).rows[0]
    if any(s.name == "enforce-eager" and _kept(s) for s in out):
        return
    if eager.tpot_ms < graph.tpot_ms:
        _set(out, "enforce-eager", True, f"projected TPOT at 8 requests: eager {eager.tpot_ms:.1f} ms, graph "
                                         f"{graph.tpot_ms:.1f} ms")
        return
    syncs = (f"; if vLLM serves it through its Transformers backend (the model's own code), its "
             f"{host.syncs_per_step:g} host sync(s) per step rule graph capture out: add --enforce-eager"
             if host.syncs_per_step else "")
    _set(out, "graph-mode", "ACL graph (vLLM's default: no --enforce-eager)",
         f"projected TPOT at 8 requests: graph {graph.tpot_ms:.1f} ms against eager {eager.tpot_ms:.1f} ms{syncs}",
         kind="decision")
