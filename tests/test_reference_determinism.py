"""A deterministic reference (issue 25, class 4): parameters and buffers the model never initialises are
seeded, not left as whatever memory held; and when the unpatched original still disagrees with itself,
the verdict says so instead of blaming the port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from agents.models import RunRecord
from agents.validation.compare import self_disagreement
from sandbox.inputs.model_inputs import marked_uninitialised, seed_parameters


class _Uninitialised(nn.Module):
    """A parameter and a buffer made with torch.empty that no init touches, beside ones that are set."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.empty(8))  # never initialised (an `_init_weights` that skips it)
        self.proj = nn.Linear(8, 8)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))
        self.register_buffer("cache", torch.empty(4, 8))
        self.register_buffer("steps", torch.empty(3, dtype=torch.long))


def _build(seed: int = 0) -> _Uninitialised:
    torch.manual_seed(seed)  # as the harness does before construction
    with marked_uninitialised():
        model = _Uninitialised()
    seed_parameters(model, seed)
    return model


def test_uninitialised_memory_is_marked_then_seeded_the_same_in_every_build() -> None:
    with marked_uninitialised():
        raw = _Uninitialised()
    assert bool(torch.isnan(raw.scale).all()) and bool(torch.isnan(raw.cache).all())  # marked, not garbage
    assert not torch.are_deterministic_algorithms_enabled()  # the mode ends with the construction
    a, b = _build(), _build()
    for name, t in [*a.named_parameters(), *a.named_buffers()]:
        other = dict([*b.named_parameters(), *b.named_buffers()])[name]
        assert bool(torch.isfinite(t.float()).all()), name
        assert torch.equal(t, other), name
    assert float(a.scale.detach().std()) > 0  # seeded values, not a constant fill
    assert a.steps.tolist() == [0, 0, 0]
    expected = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    assert torch.equal(a.inv_freq, expected)  # a buffer the model computed keeps its values
    assert not torch.equal(_build(1).scale, a.scale)  # the seed reaches it


def test_garbage_that_is_not_marked_is_still_seeded_when_it_is_not_finite() -> None:
    model = _Uninitialised()
    with torch.no_grad():
        model.scale.copy_(torch.tensor([float("inf"), 1e38, float("nan"), 0, 0, 0, 0, 0]))
    seed_parameters(model, 0)
    assert bool(torch.isfinite(model.scale).all()) and float(model.scale.abs().max()) < 1.0


def test_a_large_parameter_keeps_its_spread_from_a_sample_and_uninitialised_ones_still_show() -> None:
    """Past STAT_SAMPLE elements the mean and spread are read from a stride (a 2e9-value model seeded in
    seconds, not a minute): the seeded values keep the model's spread, and an all-NaN tensor is still seeded
    from the config's initializer_range."""
    from sandbox.inputs.model_inputs import STAT_SAMPLE

    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(STAT_SAMPLE + 12345) * 0.5 + 2.0)
            self.blank = nn.Parameter(torch.full((STAT_SAMPLE * 2,), float("nan")))

    model = Wide()
    before = model.w.detach().clone()
    seed_parameters(model, 0)
    std, mean = torch.std_mean(model.w.detach())
    assert abs(float(std) - 0.5) < 0.005 and abs(float(mean) - 2.0) < 0.005
    assert not torch.equal(before, model.w.detach())  # seeded by name, not the model's draw
    assert bool(torch.isfinite(model.blank).all()) and abs(float(model.blank.detach().std()) - 0.02) < 0.001


def test_a_complex_rotary_buffer_keeps_its_values_and_integer_buffers_are_still_checked() -> None:
    # Llama-style freqs_cis is complex64: the integer check once asked torch.iinfo of it and every run of
    # such a model died in the harness before the model ran (bench/hazard_corpus.py's complex_rotary_bnb).
    class Rotary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            freqs = torch.outer(torch.arange(4).float(), 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))
            self.register_buffer("freqs_cis", torch.polar(torch.ones_like(freqs), freqs))
            self.register_buffer("blank", torch.full((2, 2), complex(float("nan"), float("nan"))))
            self.register_buffer("unset", torch.full((3,), torch.iinfo(torch.long).max))

    model = Rotary()
    expected = model.freqs_cis.clone()
    seed_parameters(model, 0)
    assert torch.equal(model.freqs_cis, expected)
    assert bool(torch.isfinite(torch.view_as_real(model.blank)).all())
    assert model.unset.tolist() == [0, 0, 0]


def _record(run_id: str, tokens: list[list[int]] | None, ok: bool = True) -> RunRecord:
    return RunRecord(id=run_id, purpose="reference", target="cpu", ok=ok, status="ok" if ok else "error",
                     wall_s=1.0, result_path="result.json", tokens=tokens)


def test_a_reference_that_disagrees_with_itself_is_the_verdict() -> None:
    verdict = self_disagreement(_record("reference", [[1, 2, 3, 4]]), _record("reference-2", [[1, 2, 9, 9]]))
    assert verdict is not None and verdict.verdict == "nondeterministic-reference"
    assert verdict.detail.startswith("the original is not deterministic") and "50% agree" in verdict.detail
    assert self_disagreement(_record("reference", [[1, 2]]), _record("reference-2", [[1, 2]])) is None
    assert self_disagreement(_record("reference", [[1, 2]]), _record("reference-2", None, ok=False)) is None


NOISY = '''import os
import torch
from torch import nn


class NoisyLM(nn.Module):
    """Its forward adds noise from the OS, which no seed reaches: two runs never agree."""

    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 16)
        self.head = nn.Linear(16, config["vocab"])

    def forward(self, ids):
        noise = torch.tensor(list(os.urandom(ids.shape[1] * 32)), dtype=torch.float32).view(1, -1, 32)
        return self.head(torch.tanh(self.emb(ids))) + noise

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=6):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.forward(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids[:, input_ids.shape[1]:]


def make_inputs(config, seed):
    return {"input_ids": torch.randint(0, config["vocab"], (1, 5), generator=torch.Generator().manual_seed(seed))}
'''

MANIFEST = """name: noisy
entry:
  class: modeling_noisy:NoisyLM
config: config.json
inputs: modeling_noisy:make_inputs
run:
  method: generate
  kwargs: {max_new_tokens: 6}
"""


@pytest.mark.slow
def test_a_port_of_a_nondeterministic_original_is_not_blamed(tmp_path: Path, npuport_home: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    model = tmp_path / "noisy"
    model.mkdir()
    (model / "npuport.yaml").write_text(MANIFEST)
    (model / "config.json").write_text(json.dumps({"vocab": 32}))
    (model / "modeling_noisy.py").write_text(NOISY)
    state = run_port({"request": {"model_path": str(model), "target": "cpu", "policy": "rule",
                                  "out_dir": str(tmp_path / "bundle")}}, "noisy")
    numerics = state["numerics"]
    assert numerics["verdict"] == "nondeterministic-reference", numerics
    assert numerics["detail"].startswith("the original is not deterministic")
    assert "first diverging module" not in numerics["detail"]
    assert [r["id"] for r in state["runs"] if r["purpose"] == "reference"] == ["reference", "reference-2"]
    report = (tmp_path / "bundle" / "report.md").read_text()
    assert "the original is not deterministic" in report
