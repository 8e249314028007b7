"""An honest benchmark: new tokens only (a generate that returns prompt + continuation is counted by its
continuation), the same counting for the original and the port, "not measured" instead of 0.0, knobs
that reach the executed run (or are not searched), and a slower tuned port never called an improvement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.deploy import plots
from agents.deploy.bundle import benchmark_lines
from agents.tuning.port import facts_of, knob_effects, performance_sentence, settle
from agents.tuning.search import Outcome, Trial, TuneResult
from agents.tuning.space import HostFacts, ModelFacts, torch_space
from sandbox.bench.runner import run_bench
from sandbox.bench.throughput import new_token_counts
from sandbox.isolation.process import Limits

# A transformers-style toy: generate returns prompt + continuation, the config object carries
# _attn_implementation and the attention reads it (sdpa vs a hand-written softmax).
HF_STYLE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Cfg:
    def __init__(self, d):
        self.__dict__.update(d)


class Toy(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = Cfg(config)
        d = config["hidden_size"]
        self.emb = nn.Embedding(config["vocab_size"], d)
        self.qkv = nn.Linear(d, 3 * d)
        self.head = nn.Linear(d, config["vocab_size"])

    def attend(self, h):
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        if self.config._attn_implementation == "sdpa":
            return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return w @ v

    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids
        for _ in range(max_new_tokens):
            h = self.attend(self.emb(ids)).mean(dim=1)
            ids = torch.cat([ids, self.head(h).argmax(-1, keepdim=True)], dim=1)
        return ids  # prompt + continuation, as transformers' generate returns


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 6), generator=g)}
'''
MANIFEST = {"entry": {"class": "hf_toy:Toy"}, "config": "config.json", "inputs": "hf_toy:make_inputs",
            "run": {"method": "generate", "kwargs": {"max_new_tokens": 4}}}


@pytest.fixture()
def hf_toy(tmp_path: Path) -> Path:
    d = tmp_path / "hf_toy"
    d.mkdir()
    (d / "hf_toy.py").write_text(HF_STYLE)
    (d / "config.json").write_text(json.dumps({"vocab_size": 32, "hidden_size": 16, "_attn_implementation": "eager"}))
    return d


def test_new_token_counts_strip_the_prompt_only_when_echoed() -> None:
    assert new_token_counts([[1, 2, 3, 9, 8]], [[1, 2, 3]]) == [2]  # prompt + continuation
    assert new_token_counts([[9, 8]], [[1, 2, 3]]) == [2]  # continuation only
    assert new_token_counts([[1, 2, 7, 9]], [[1, 2, 3]]) == [4]  # not the prompt: all of it is new
    assert new_token_counts([[5, 6]], None) == [2]


def test_bench_counts_new_tokens_and_records_what_each_knob_changed(hf_toy: Path, tmp_path: Path) -> None:
    configs: list[dict[str, Any]] = [{"id": "eager", "attn": "eager"}, {"id": "sdpa", "attn": "sdpa"},
                                     {"id": "bf16", "dtype": "bfloat16", "attn": "eager"},
                                     {"id": "t1", "threads": 1}, {"id": "t2", "threads": 2},
                                     {"id": "kv", "kv_cache": False}]
    run = run_bench(workdir=tmp_path, model_dir=hf_toy, run_dir=tmp_path / "r", manifest=MANIFEST, configs=configs,
                    concurrencies=[2], warmup=1, repeats=1, limits=Limits(wall_s=180))
    assert run.ok, run.error()
    by = {c["id"]: c for c in run.result["configs"]}
    for cid in ("eager", "sdpa", "bf16", "t1", "t2"):
        assert by[cid]["status"] == "ok", by[cid].get("detail")
        assert by[cid]["points"][0]["new_tokens"] == 2 * 4  # 2 requests x 4 new tokens; prompts (6 each) not counted
    eager, sdpa = by["eager"]["effects"], by["sdpa"]["effects"]
    assert (eager["attn"], sdpa["attn"]) == ("eager", "sdpa")  # read back from the built model
    assert any("scaled_dot_product" in op for op in sdpa["ops"]) and not any("scaled_dot_product" in op
                                                                             for op in eager["ops"])
    assert eager["param_dtype"] == "float32" and by["bf16"]["effects"]["param_dtype"] == "bfloat16"
    assert (by["t1"]["effects"]["threads"], by["t2"]["effects"]["threads"]) == (1, 2)
    # A knob the run cannot apply is not measured as if it had been.
    assert by["kv"]["status"] == "infeasible" and "kv_cache" in by["kv"]["detail"]

    # The original's benchmark (cuda->cpu redirect) counts by the same rule.
    base = run_bench(workdir=tmp_path, model_dir=hf_toy, run_dir=tmp_path / "b", manifest=MANIFEST,
                     configs=[{"id": "baseline", "batch": 1}], device="cuda", redirect="cuda->cpu",
                     concurrencies=[2], warmup=0, repeats=1, limits=Limits(wall_s=180))
    assert base.ok, base.error()
    assert base.result["configs"][0]["points"][0]["new_tokens"] == 2 * 4


def test_search_space_holds_only_knobs_that_reach_the_run(tmp_path: Path) -> None:
    facts = HostFacts(target="cpu", cores=2, model=ModelFacts(hidden_size=16, num_layers=1, supports_kv_cache=True,
                                                              attn_impls=("eager", "sdpa")))
    names = [d.name for d in torch_space(facts).dims]
    assert "kv_cache" not in names and "attn" in names
    # A model whose config names an attention implementation that its own code never reads: no attn knob.
    model = tmp_path / "w" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"hidden_size": 16, "_attn_implementation": "eager"}))
    (model / "modeling.py").write_text("import torch\n")
    state = {"request": {}, "entry": {"config": "config.json"}, "workdir": str(tmp_path / "w"),
             "target": {"name": "cpu"}}
    assert facts_of(state).model.attn_impls == ()
    (model / "modeling.py").write_text("impl = config._attn_implementation\n")
    assert facts_of(state).model.attn_impls == ("eager", "sdpa", "flash_attention_2")


def _pts(c_to_tps: dict[int, float]) -> list[dict[str, Any]]:
    return [{"concurrency": c, "tokens_per_s": v, "latency_p50_s": 0.1, "latency_p99_s": 0.2}
            for c, v in c_to_tps.items()]


def test_a_slower_tuned_port_is_reported_slower_and_not_deployed() -> None:
    searched = {"batch": 8, "dtype": "bfloat16"}
    best, tuned = settle(searched, _pts({1: 3.0, 8: 7.0}), _pts({8: 10.0}), 10.0 / 0.7)
    assert best == {"batch": 1} and tuned["chosen"] == "untuned"  # the deploy takes the faster configuration
    assert tuned["tokens_per_s"] == 10.0 and tuned["tuned_vs_untuned"] == "slower"
    assert tuned["vs_original"] == "slower" and tuned["speedup"] == pytest.approx(0.7)
    text = performance_sentence(tuned)
    assert "SLOWER than the untuned port" in text and "SLOWER than the original (0.70x" in text
    assert "not an improvement" in text

    best, tuned = settle(searched, _pts({8: 30.0}), _pts({8: 10.0}), 5.0)
    assert best == searched and tuned["chosen"] == "tuned" and tuned["speedup"] == pytest.approx(6.0)
    assert "SLOWER" not in performance_sentence(tuned)


def test_what_was_not_measured_says_so_in_report_json_and_plots(tmp_path: Path) -> None:
    best, tuned = settle({"batch": 8}, _pts({1: 5.0, 2: 9.0, 4: 15.0, 8: 20.0}), [], None)
    assert tuned["speedup"] is None and tuned["untuned"]["tokens_per_s"] is None  # None in data, never 0.0
    assert tuned["vs_original"] == "not measured"
    tuning = {"status": "done", "best": best, "tuned": tuned,
              "baseline": {"points": _pts({1: 2.0}), "tokens_per_s": None}, "trials": []}
    text = "\n".join(benchmark_lines(tuning))
    assert "0.0" not in text.replace("20.0", "")
    assert "| 2 | not measured | not measured | 9.0 |" in text
    assert "the original was not measured: no speed-up is claimed" in text
    out = plots.baseline_vs_tuned(tuning, tmp_path / "b.png", "toy")
    assert out is not None and out.read_bytes()[:4] == b"\x89PNG"


def test_knob_effects_compare_trials_that_differ_in_one_knob() -> None:
    def trial(i: int, params: dict[str, Any], effects: dict[str, Any]) -> Trial:
        return Trial(i, params, Outcome(1.0, extras={"effects": effects}), 0.1)

    same = {"ops": {"aten.mm": 2}, "param_dtype": "float32"}
    trials = [trial(1, {"batch": 1, "attn": "eager", "dtype": "float32"}, same),
              trial(2, {"batch": 1, "attn": "sdpa", "dtype": "float32"}, same),  # attn changed nothing
              trial(3, {"batch": 1, "attn": "eager", "dtype": "bfloat16"}, {**same, "param_dtype": "bfloat16"})]
    eff = knob_effects(TuneResult(trials, trials[0], "budget", 3, 0))
    assert eff["attn"] == "changed nothing in the executed run"
    assert eff["dtype"] == "changed the executed run"
    assert eff["batch"].startswith("not compared")


def test_decode_profile_table_says_not_measured() -> None:
    from agents.validation.perf_evidence import perf_markdown

    perf = {"profiled": True, "pathologies": [], "port": {"counters": "cpu-host-reads", "steps": [{}]},
            "rows": [{"step": 0, "input_len": 4, "ref_input_len": None, "ms": 1.5, "ref_ms": None, "ops": None,
                      "syncs": 0, "ref_syncs": None, "fallbacks": 0, "cache_bytes": None, "ref_cache_bytes": None}]}
    text = "\n".join(perf_markdown(perf, "validated"))
    assert "| 0 | n/m / 4 | n/m / 1.50 | n/m |" in text and "n/m: not measured" in text


@pytest.mark.slow
def test_compile_knob_reaches_the_run(hf_toy: Path, tmp_path: Path) -> None:
    """torch.compile is applied to the model the benchmark times (its blocks are compiled in place)."""
    run = run_bench(workdir=tmp_path, model_dir=hf_toy, run_dir=tmp_path / "c", manifest=MANIFEST,
                    configs=[{"id": "plain"}, {"id": "compiled", "compile": "default"}], concurrencies=[1], warmup=1,
                    repeats=1, limits=Limits(wall_s=400))
    assert run.ok, run.error()
    plain, compiled = run.result["configs"]
    assert plain["status"] == "ok" and "compiled_modules" not in plain["effects"]
    if compiled["status"] == "infeasible":  # no working compiler toolchain on this host: said, not measured
        assert "torch.compile" in compiled["detail"] and not compiled["points"]
    else:
        assert compiled["status"] == "ok", compiled.get("detail")
        assert compiled["effects"]["compiled_modules"] == 3 and compiled.get("compile_s", 0) > 0  # emb, qkv, head


def test_slower_at_any_concurrency_is_said_and_the_spread_printed() -> None:
    """Issue 27: at concurrency 1 the tuned port was slower than the original (6.7 vs 8.9) unremarked."""
    from agents.tuning.port import fmt_params, slower_at

    deployed = [{**p, "tokens_per_s_runs": [p["tokens_per_s"]] * 5, "spread": 0.12} for p in _pts({1: 6.7, 8: 30.0})]
    original = _pts({1: 8.9, 8: 10.0})
    best, tuned = settle({"batch": 4, "attn": None}, deployed, _pts({8: 12.0}), 10.0)
    tuned.update(compared_at={"batch": 4, "concurrency": 8}, slower_at=slower_at(deployed, original))
    assert tuned["slower_at"] == [{"concurrency": 1, "port": 6.7, "original": 8.9}]
    text = performance_sentence(tuned)
    assert "3.00x the original's throughput at batch 4, concurrency 8" in text
    assert "SLOWER than the original at concurrency 1 (6.7 vs 8.9 tokens/s)" in text
    assert "(median of 5 runs, spread 12%)" in text
    assert "attn=None" not in text and fmt_params(best) == "batch=4"


def test_verify_measures_the_figure_as_the_tuner_does() -> None:
    """The deployed figure and verify's re-measurement use one spec (concurrency, warm-up, repeats)."""
    import inspect

    from agents.deploy import verify
    from agents.tuning import measure

    spec = measure.headline_spec()
    assert spec == {"concurrencies": [measure.TUNE_CONCURRENCY], "warmup": 1, "repeats": measure.HEADLINE_REPEATS}
    assert measure.HEADLINE_REPEATS > measure.TRIAL_REPEATS
    assert "headline_spec()" in inspect.getsource(verify._throughput_claim)
    assert "headline_spec()" in inspect.getsource(measure.PortBench.headline)
