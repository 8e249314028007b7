"""A class loaded as a causal LM that never mixed GenerationMixin in has generate only in transformers releases
before 4.50 (sandbox/harness/feeding.py ``present_run_method``): where the built model has none, the harness runs
its forward and compares the named outputs, and says so, instead of failing on its own generate call and blaming
the model (a long-convolution DNA release did)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel

from sandbox.harness.feeding import method_at, model_inputs_for, present_run_method


class _Config(PretrainedConfig):
    model_type = "npuport-test-conv"

    def __init__(self, vocab_size: int = 12, d_model: int = 8, **kwargs: object) -> None:
        self.vocab_size, self.d_model = vocab_size, d_model
        super().__init__(**kwargs)


class _ConvLM(PreTrainedModel):
    config_class = _Config

    def __init__(self, config: _Config) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.head(self.embed(input_ids))}


class _GenLM(_ConvLM, GenerationMixin):
    pass


def test_a_model_without_generate_runs_forward_with_a_note(tmp_path: Path) -> None:
    model = _ConvLM(_Config())
    manifest = {"run": {"method": "generate", "kwargs": {"max_new_tokens": 8}}}
    if callable(getattr(model, "generate", None)):  # transformers < 4.50 on this host: the class generates
        assert present_run_method(model, manifest) == (manifest, None)
        return
    run_as, note = present_run_method(model, manifest)
    assert run_as["run"]["method"] == "forward" and manifest["run"]["method"] == "generate"  # a copy
    assert note is not None and "_ConvLM has no generate" in note and "4.50" in note
    inputs, _, _ = model_inputs_for(model, run_as, tmp_path, {"vocab_size": 12}, 0, {})
    out = method_at(model, run_as["run"]["method"])(**inputs)
    assert out["logits"].shape[-1] == 12


def test_a_model_that_generates_or_a_forward_run_is_left_as_written() -> None:
    gen = _GenLM(_Config())
    manifest = {"run": {"method": "generate"}}
    assert present_run_method(gen, manifest) == (manifest, None)
    forward = {"run": {"method": "forward"}}
    assert present_run_method(_ConvLM(_Config()), forward) == (forward, None)
