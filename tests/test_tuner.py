"""Tuning: typed spaces, constraints that prune before anything runs, the search (budgets, noise,
early stop, restart), the baselines it is compared with, and the tuner node's contract."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pydantic
import pytest

from agents.models import Tuning
from agents.nodes.tuner import tuner_node
from agents.tuning.constraints import prune
from agents.tuning.port import search, trial_records
from agents.tuning.search import Budget, Outcome, npuport_search, random_search, tpe_search
from agents.tuning.space import (
    Dim,
    HostFacts,
    ModelFacts,
    SearchSpace,
    VllmAscendConfig,
    fused_ops_space,
    model_facts,
    torch_space,
    typed,
    vllm_space,
)
from knowledge.errors import NoFeasiblePoint

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ocr_mini"


def ocr_facts(target: str = "cpu", chip: str = "910b", cores: int = 4) -> HostFacts:
    config = json.loads((EXAMPLE / "config.json").read_text())
    return HostFacts(target=target, chip=chip, cores=cores, model=model_facts(config, has_custom_code=True))


def test_model_facts_from_ocr_mini_config() -> None:
    f = ocr_facts().model
    assert (f.hidden_size, f.num_layers, f.max_position) == (64, 2, 128)
    assert f.moe and f.num_experts == 4 and f.remote_code
    assert not f.supports_kv_cache  # ocr_mini has no use_cache flag
    assert "sdpa" in f.attn_impls


def test_constraints_prune_before_running() -> None:
    facts = ocr_facts(target="ascend-sim", chip="310p")
    space = torch_space(facts, batches=[1, 8])
    feasible, pruned = prune(space, facts)
    assert feasible and pruned
    assert all(p["dtype"] != "bfloat16" for p in feasible)  # no bf16 on 310P
    assert all(p["attn"] != "flash_attention_2" for p in feasible)
    assert all(p["compile"] == "none" for p in feasible)  # no torchair in the emulator
    assert all("kv_cache" not in p for p in feasible)  # no KV-cache knob: the run could not apply it
    reasons = {r for _, why in pruned for r in why}
    assert any("310P" in r for r in reasons)

    cpu = ocr_facts(cores=2)
    cpu_space = SearchSpace(name="t", target="cpu", dims=[Dim(name="threads", values=[1, 2, 4], ordered=True)])
    ok, out = prune(cpu_space, cpu)
    assert [p["threads"] for p in ok] == [1, 2]
    assert "exceeds the 2 usable CPU cores" in out[0][1][0]


def test_memory_bound_prunes_large_batches() -> None:
    facts = ocr_facts()
    facts.memory_bytes = 8 * 2**20  # an 8 MiB "host"
    space = SearchSpace(name="m", target="cpu", dims=[Dim(name="batch", values=[1, 4096], ordered=True)])
    ok, pruned = prune(space, facts)
    assert [p["batch"] for p in ok] == [1]
    assert "GiB budget" in pruned[0][1][0]


def test_vllm_and_fused_constraints_and_types() -> None:
    facts = ocr_facts(target="vllm-ascend")
    facts.model.max_position = 4096
    space = vllm_space(facts, max_model_len=4096)
    feasible, pruned = prune(space, facts)
    assert feasible
    for p in feasible:
        assert p["enable_chunked_prefill"] or p["max_num_batched_tokens"] >= p["max_model_len"]
        assert p["max_num_seqs"] <= p["max_num_batched_tokens"]
        assert p["enforce_eager"] == (p["cudagraph_mode"] == "NONE")
        assert isinstance(typed(space, p), VllmAscendConfig)
    with pytest.raises(pydantic.ValidationError):
        VllmAscendConfig(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=4096, gpu_memory_utilization=1.5)
    fused = fused_ops_space(ocr_facts(target="ascend-sim"))
    ok, _ = prune(fused, ocr_facts(target="ascend-sim"))
    assert {"attention_op": "sdpa", "input_layout": "BSND", "rms_norm": "eager", "rotary": "eager"} not in ok
    assert all(p["attention_op"] == "sdpa" for p in prune(fused, ocr_facts(target="cpu"))[0])


def test_empty_space_ends_with_a_clear_message_and_runs_nothing() -> None:
    facts = ocr_facts(target="ascend-sim", chip="310p")
    space = SearchSpace(name="bf16-only", target="ascend-sim",
                        dims=[Dim(name="dtype", values=["bfloat16"]), Dim(name="batch", values=[1, 2], ordered=True)])
    calls: list[dict[str, Any]] = []

    def evaluate(p: dict[str, Any]) -> Outcome:
        calls.append(p)
        return Outcome(1.0)

    with pytest.raises(NoFeasiblePoint, match="no configuration of the search space 'bf16-only'"):
        npuport_search(space, facts, evaluate)
    tuning, result = search(space, facts, evaluate, Budget())
    assert result is None and calls == []
    assert tuning.status == "failed"
    assert "310P has no bfloat16" in tuning.detail and "Nothing was run" in tuning.detail


def _synthetic(space: SearchSpace, seed: int) -> dict[tuple[Any, ...], float]:
    """A multiplicative landscape with one interaction, like throughput grids are: along an ordered
    dimension the effect is unimodal (rises to a peak at a random place, then falls); categorical
    values have arbitrary effects."""
    rng = random.Random(seed)
    effects: dict[str, dict[Any, float]] = {}
    for d in space.dims:
        if d.ordered:
            peak = rng.randrange(len(d.values))
            effects[d.name] = {v: rng.uniform(0.6, 0.9) ** abs(i - peak) for i, v in enumerate(d.values)}
        else:
            effects[d.name] = {v: rng.uniform(0.3, 1.0) for v in d.values}
    table = {}
    for p in space.points():
        v = math.prod(effects[d.name][p[d.name]] for d in space.dims)
        table[space.key(p)] = v * (1.3 if p["batch"] == 4 and p["attn"] == "eager" else 1.0)
    return table


def _space() -> SearchSpace:
    return SearchSpace(name="syn", target="cpu", dims=[
        Dim(name="batch", values=[1, 2, 4, 8, 16], ordered=True, prior=16),
        Dim(name="threads", values=[1, 2, 4], ordered=True, prior=4),
        Dim(name="attn", values=["eager", "sdpa"], prior="sdpa"),
        Dim(name="dtype", values=["float32", "bfloat16", "float16"], prior="float32")])


def test_npuport_search_beats_random_on_synthetic_landscapes() -> None:
    space = _space()
    facts = HostFacts(target="cpu", cores=4)
    ours, rand = [], []
    for seed in range(10):
        table = _synthetic(space, seed)
        best = max(table.values())

        def first_hit(method: Any, table: dict[tuple[Any, ...], float] = table, best: float = best,
                      seed: int = seed) -> int:
            res = method(space, facts, lambda p: Outcome(table[space.key(p)]), Budget(max_trials=60), seed=seed)
            return next((t.index for t in res.trials if table[space.key(t.params)] >= 0.95 * best), 61)

        ours.append(first_hit(npuport_search))
        rand.append(first_hit(random_search))
    ours.sort()
    rand.sort()
    assert ours[len(ours) // 2] <= 15
    assert ours[len(ours) // 2] < rand[len(rand) // 2]


def test_budget_early_stop_noise_repeat_and_failures() -> None:
    space = _space()
    facts = HostFacts(target="cpu", cores=4)
    table = _synthetic(space, 3)
    res = npuport_search(space, facts, lambda p: Outcome(table[space.key(p)]), Budget(max_trials=4))
    assert len(res.trials) == 4 and "trial budget" in res.stopped
    res = npuport_search(space, facts, lambda p: Outcome(table[space.key(p)]), Budget(max_trials=200))
    assert res.stopped.startswith("converged") and len(res.trials) < space.size()
    assert res.best is not None and res.best.value == max(t.value or 0 for t in res.trials)

    # Noise: a challenger within the measured spread of the incumbent is measured again.
    flat = SearchSpace(name="n", target="cpu", dims=[Dim(name="batch", values=[1, 2], ordered=True, prior=1)])
    noisy = npuport_search(flat, facts, lambda p: Outcome(100.0 + 10.0 * p["batch"], spread=0.5), Budget(max_trials=10))
    assert any("repeat" in t.note for t in noisy.trials)

    # A point that fails when run is recorded, never chosen.
    def evaluate(p: dict[str, Any]) -> Outcome:
        if p["batch"] == 16:
            return Outcome(None, "error", "RuntimeError: out of memory")
        return Outcome(table[space.key(p)])

    res = npuport_search(space, facts, evaluate, Budget(max_trials=30))
    assert res.trials[0].outcome.status == "error" and res.best is not None and res.best.params["batch"] != 16
    records = trial_records(res)
    assert records[0].status == "error" and "out of memory" in records[0].detail
    assert [r.id for r in records] == [f"trial-{i}" for i in range(1, len(records) + 1)]


def test_a_lucky_run_of_a_noisy_point_does_not_pull_the_walk_or_win() -> None:
    """A point whose runs spread widely (2 threads fighting the host for 2 cores) is judged by its median
    discounted by its spread: its lucky 5 % over a steady incumbent neither moves the walk nor is the answer,
    and the walk goes on to the steady optimum along the other dimension."""
    space = SearchSpace(name="noisy", target="cpu", dims=[
        Dim(name="batch", values=[1, 2, 4], ordered=True, prior=4),
        Dim(name="threads", values=[1, 2], ordered=True, prior=1)])
    facts = HostFacts(target="cpu", cores=2)
    table = {(4, 1): (100.0, 0.05), (2, 1): (105.0, 1.8), (1, 1): (40.0, 0.05),
             (4, 2): (130.0, 0.05), (2, 2): (60.0, 0.05), (1, 2): (30.0, 0.05)}
    res = npuport_search(space, facts, lambda p: Outcome(table[space.key(p)][0], spread=table[space.key(p)][1]),
                         Budget(max_trials=20))
    assert res.best is not None and space.key(res.best.params) == (4, 2), [t.params for t in res.trials]
    walked = [space.key(t.params) for t in res.trials]
    assert walked[:3] == [(4, 1), (2, 1), (4, 2)], walked  # not down the batch dimension after the noisy point
    # the same 5 % from a steady point does move the walk
    table[(2, 1)] = (105.0, 0.05)
    res = npuport_search(space, facts, lambda p: Outcome(table[space.key(p)][0], spread=table[space.key(p)][1]),
                         Budget(max_trials=20))
    walked = [space.key(t.params) for t in res.trials]
    assert walked[:3] == [(4, 1), (2, 1), (1, 1)], walked


def test_tpe_and_random_respect_constraints_and_never_rerun_a_point() -> None:
    facts = HostFacts(target="cpu", cores=2)
    space = SearchSpace(name="c", target="cpu", dims=[Dim(name="threads", values=[1, 2, 4, 8], ordered=True),
                                                      Dim(name="batch", values=[1, 2, 4], ordered=True)])
    for method in (tpe_search, random_search):
        seen: list[tuple[int, int]] = []

        def evaluate(p: dict[str, Any], seen: list[tuple[int, int]] = seen) -> Outcome:
            seen.append((p["threads"], p["batch"]))
            return Outcome(float(p["batch"] * p["threads"]))

        res = method(space, facts, evaluate, Budget(max_trials=20), seed=1)
        assert all(t <= 2 for t, _ in seen)  # threads > cores never run
        assert len(seen) == len(set(seen)) == 6  # the whole feasible grid, once each
        assert res.best is not None and res.best.value == 8.0



def test_tpe_and_random_run_a_given_prior_point_first() -> None:
    """bench/tuner_efficiency.py gives every method the same prior: the baselines start at it too."""
    facts = HostFacts(target="cpu", cores=8)
    space = SearchSpace(name="p", target="cpu", dims=[Dim(name="threads", values=[1, 2, 4, 8], ordered=True),
                                                      Dim(name="batch", values=[1, 2, 4], ordered=True)])
    start = {"threads": 2, "batch": 4}
    for method in (tpe_search, random_search):
        for seed in range(3):
            res = method(space, facts, lambda p: Outcome(float(p["batch"] * p["threads"])), Budget(max_trials=5),
                         seed=seed, start=start)
            assert res.trials[0].params == start
            assert len({space.key(t.params) for t in res.trials}) == len(res.trials)  # the start is not rerun

def test_tuner_node_contract_without_tuning() -> None:
    state = {"request": {"tune": False}, "runs": [
        {"id": "reference", "purpose": "reference", "ok": True, "status": "ok", "wall_s": 1.0, "result_path": "r.json",
         "timings": {"run_s": [1.0]}, "target": "cpu (cuda->cpu redirect)"},
        {"id": "run-1", "purpose": "port", "ok": True, "status": "ok", "wall_s": 0.1, "result_path": "p.json",
         "timings": {"run_s": [0.1]}, "target": "cpu"}]}
    out = tuner_node(state)
    assert set(out) == {"tuning", "trace"}
    t = Tuning(**out["tuning"])
    assert t.status == "skipped" and t.tuned["run_s"] == [0.1] and t.baseline["run_s"] == [1.0]
    assert out["trace"][0]["agent"] == "tuner"


def test_space_grid_and_priors() -> None:
    space = torch_space(ocr_facts(cores=4), batches=[1, 4])
    pts = list(space.points())
    assert len(pts) == space.size() == math.prod(len(d.values) for d in space.dims)
    assert space.dim("batch").start() == 4 and space.dim("threads").start() == 4
    assert len({space.key(p) for p in pts}) == len(pts)
    assert list(itertools.islice(space.points(), 1))[0]["batch"] == 1
    assert ModelFacts(hidden_size=8, num_layers=1, vocab_size=10, intermediate_size=16).param_estimate() > 0
