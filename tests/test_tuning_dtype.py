"""The tuner's dtype knob on model code that cannot run in half precision.

A class of real model code: a sub-module hands its output on as float32 (``return x.float()`` after an
autocast region, a tensor built with dtype=torch.float32 in forward), which then meets the weights of a
model cast to float16/bfloat16 (LayerNorm, Linear) and torch raises a mixed-dtype error. Such a trial is
no tuning result: the benchmark run (real, in the sandbox) is recorded as "dtype X not supported by the
model code" with where it failed, the search runs no other point with that value, and the report says so.
Only the objective in the search test is synthetic (the search is the unit under test there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.models import Tuning
from agents.report.bundle import render_markdown
from agents.tuning.measure import outcome_of, unsupported_reason
from agents.tuning.port import knob_effects, trial_records, unsupported_values
from agents.tuning.search import Budget, Outcome, npuport_search, random_search, tpe_search
from agents.tuning.space import Dim, HostFacts, SearchSpace
from sandbox.bench.runner import run_bench
from sandbox.isolation.process import Limits

# The vision tower returns float32 whatever the weights' dtype; the encoder's LayerNorm then gets a
# float32 input and half-precision weights.
UPCAST_MODEL = '''
import torch
import torch.nn as nn


class Tower(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return self.proj(x).float()


class Toy(nn.Module):
    def __init__(self, config):
        super().__init__()
        d = config["hidden_size"]
        self.emb = nn.Embedding(config["vocab_size"], d)
        self.tower = Tower(d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, config["vocab_size"])

    def generate(self, input_ids, pixel_values, max_new_tokens=3):
        ids = input_ids
        image = self.tower(pixel_values)
        for _ in range(max_new_tokens):
            h = self.norm(self.emb(ids).mean(dim=1) + image)
            ids = torch.cat([ids, self.head(h).argmax(-1, keepdim=True)], dim=1)
        return ids[:, input_ids.shape[1]:]


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 5), generator=g),
            "pixel_values": torch.randn(1, config["hidden_size"], generator=g)}
'''
MANIFEST = {"entry": {"class": "upcast:Toy"}, "config": "config.json", "inputs": "upcast:make_inputs",
            "run": {"method": "generate", "kwargs": {"max_new_tokens": 3}}}


@pytest.fixture()
def upcast_model(tmp_path: Path) -> Path:
    d = tmp_path / "upcast"
    d.mkdir()
    (d / "upcast.py").write_text(UPCAST_MODEL)
    (d / "config.json").write_text(json.dumps({"vocab_size": 32, "hidden_size": 16}))
    return d


def test_a_half_dtype_the_model_code_cannot_run_is_recorded_as_unsupported(upcast_model: Path, tmp_path: Path) -> None:
    run = run_bench(workdir=tmp_path, model_dir=upcast_model, run_dir=tmp_path / "r", manifest=MANIFEST,
                    configs=[{"id": "trial-1", "batch": 1, "dtype": "float16"}, {"id": "fp32", "batch": 1}],
                    concurrencies=[1], warmup=0, repeats=1, limits=Limits(wall_s=180))
    assert run.ok, run.error()
    half, fp32 = run.result["configs"]
    assert fp32["status"] == "ok", fp32.get("detail")  # the same model runs as written
    assert half["status"] == "error" and "dtype" in half["detail"].lower()
    outcome = outcome_of(run)
    assert outcome.status == "unsupported" and outcome.value is None
    assert outcome.detail.startswith("dtype float16 not supported by the model code: RuntimeError")
    assert "upcast.py:" in outcome.detail  # where in the model's code it failed
    assert outcome.extras["rules_out"] == {"dtype": "float16"}


def test_only_dtype_mismatches_of_a_changed_dtype_are_blamed_on_the_model_code() -> None:
    frames = [{"file": "m.py", "line": 7, "func": "forward", "code": "x = self.norm(x)", "in_model": True}]
    mixed = "RuntimeError: mixed dtype (CPU): expect parameter to have scalar type of Float"
    who, reason = unsupported_reason({"dtype": "bfloat16"}, mixed, frames) or ("", "")
    assert who == "the model code" and reason.startswith(
        "dtype bfloat16 not supported by the model code: " + mixed + " (at m.py:7 in forward: `x = self.norm(x)`);")
    assert "`.float()`" in reason and "bfloat16 weights" in reason  # what to look for in the code
    linear = "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half"
    assert unsupported_reason({"dtype": "float16"}, linear, [])[0] == "the model code"
    kernel = "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'"
    assert unsupported_reason({"dtype": "float16"}, kernel, [])[0] == "this target's operators"
    # float32 (the validated dtype) or no dtype change: a mismatch is the model's bug, not the knob's.
    assert unsupported_reason({"dtype": "float32"}, mixed, frames) is None
    assert unsupported_reason({"batch": 8}, mixed, frames) is None
    # Other failures of a half run stay errors: a device mix, memory.
    device = "RuntimeError: Input type (torch.HalfTensor) and weight type (torch.cuda.HalfTensor) should be the same"
    assert unsupported_reason({"dtype": "float16"}, device, []) is None
    assert unsupported_reason({"dtype": "float16"}, "RuntimeError: out of memory", []) is None


def _space() -> SearchSpace:
    return SearchSpace(name="t", target="cpu", dims=[
        Dim(name="batch", values=[1, 2, 4, 8], ordered=True, prior=8),
        Dim(name="dtype", values=["float32", "bfloat16", "float16"], prior="float32"),
        Dim(name="attn", values=["eager", "sdpa"], prior="sdpa")])


def _evaluate(calls: list[dict[str, Any]]) -> Any:
    def evaluate(p: dict[str, Any]) -> Outcome:
        calls.append(dict(p))
        if p["dtype"] != "float32":
            return Outcome(None, "unsupported", f"dtype {p['dtype']} not supported by the model code: RuntimeError: "
                           "mixed dtype (CPU)", extras={"rules_out": {"dtype": p["dtype"]}, "by": "the model code"})
        return Outcome(10.0 * p["batch"] + (1.0 if p["attn"] == "sdpa" else 0.0),
                       extras={"effects": {"rows": p["batch"], "attn": p["attn"], "param_dtype": "float32"}})

    return evaluate


def test_the_search_runs_an_unsupported_value_once_and_the_report_says_so() -> None:
    space = _space()
    calls: list[dict[str, Any]] = []
    res = npuport_search(space, HostFacts(target="cpu", cores=2), _evaluate(calls), Budget(max_trials=12))
    for dtype in ("bfloat16", "float16"):
        assert sum(c["dtype"] == dtype for c in calls) == 1, calls  # tried once, never again
    assert res.best is not None and res.best.params["dtype"] == "float32"
    assert unsupported_values(res) == {
        "dtype=bfloat16": "not supported by the model code: RuntimeError: mixed dtype (CPU)",
        "dtype=float16": "not supported by the model code: RuntimeError: mixed dtype (CPU)"}
    records = trial_records(res)
    assert [r.status for r in records].count("unsupported") == 2
    assert all("not supported by the model code" in r.detail for r in records if r.status == "unsupported")
    # A value that never ran is not "changed the executed run".
    eff = knob_effects(res)
    assert "bfloat16, float16 not supported by the model code (not a tuning result)" in eff["dtype"]
    assert not eff["dtype"].startswith("changed the executed run")

    tuning = Tuning(status="done", trials=records, best=dict(res.best.params), unsupported=unsupported_values(res))
    report = {"request": {}, "status": "validated", "reason": "", "counters": {}, "wall_s": 1.0, "findings": [],
              "patches": [], "diagnoses": [], "runs": [], "numerics": {}, "tuning": tuning.model_dump(mode="json")}
    text = render_markdown(report)
    assert "- not a tuning result: dtype=float16 not supported by the model code: RuntimeError" in text


@pytest.mark.parametrize("search", [random_search, tpe_search])
def test_random_and_tpe_skip_ruled_out_values_too(search: Any) -> None:
    calls: list[dict[str, Any]] = []
    search(_space(), HostFacts(target="cpu", cores=2), _evaluate(calls), Budget(max_trials=20), seed=1)
    assert sum(c["dtype"] == "float16" for c in calls) <= 1 and sum(c["dtype"] == "bfloat16" for c in calls) <= 1
