"""A class loaded as a causal LM that never mixed GenerationMixin in has generate only in transformers releases
before 4.50 (sandbox/harness/feeding.py ``present_run_method``): where the built model has none, the harness runs
its forward and compares the named outputs, and says so, instead of failing on its own generate call and blaming
the model (a long-convolution DNA release did)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel

from sandbox.harness.feeding import method_at, model_inputs_for
from sandbox.inputs.inputs_base import present_run_method


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


def test_a_custom_generate_gets_its_own_required_length_parameters() -> None:
    """``generate(input_ids, attention_mask, batch_images, min_generation_length, max_generation_length, **kw)``
    (an InfiMM-style wrapper that passes max_new_tokens on itself): the run's max_new_tokens becomes its maximum."""
    from sandbox.inputs.inputs_base import length_arguments

    def generate(input_ids, attention_mask, batch_images, min_generation_length: int, max_generation_length: int,
                 **kwargs):  # noqa: ANN001, ANN003, ANN202
        return kwargs

    inputs = {"input_ids": 1, "attention_mask": 1, "batch_images": 1}
    got = length_arguments(generate, inputs, {"max_new_tokens": 8, "do_sample": False})
    assert got == {"do_sample": False, "max_generation_length": 8, "min_generation_length": 0}
    generate(**inputs, **got)  # callable as the harness calls it: no duplicate max_new_tokens

    def plain(input_ids, max_new_tokens=20, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return kwargs

    kwargs = {"max_new_tokens": 8}
    assert length_arguments(plain, {"input_ids": 1}, kwargs) is kwargs  # nothing of its own required: as it was


CONV_CONFIG = json.dumps({"auto_map": {"AutoConfig": "configuration_conv.ConvConfig",
                                        "AutoModelForCausalLM": "modeling_conv.ConvLM"},
                          "vocab_size": 32, "d_model": 16, "model_type": "npuport-conv", "architectures": ["ConvLM"]})
CONV_CONFIGURATION = '''\
from transformers import PretrainedConfig


class ConvConfig(PretrainedConfig):
    model_type = "npuport-conv"

    def __init__(self, vocab_size=32, d_model=16, **kwargs):
        self.vocab_size, self.d_model = vocab_size, d_model
        super().__init__(**kwargs)
'''
CONV_MODELING = '''\
import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_conv import ConvConfig


class ConvLM(PreTrainedModel):
    """A long-convolution LM that never mixed GenerationMixin in: it generated only while PreTrainedModel did."""

    config_class = ConvConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.conv = nn.Conv1d(config.d_model, config.d_model, kernel_size=3, padding=2)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, input_ids, **kwargs):
        h = self.embed(input_ids).transpose(1, 2)
        h = self.conv(h)[..., : input_ids.shape[1]].transpose(1, 2)
        return CausalLMOutput(logits=self.head(torch.relu(h)))
'''


@pytest.mark.slow
def test_a_release_without_generate_ports_and_its_run_py_runs_forward(tmp_path: Path, sim_home: Path) -> None:
    """The user's path: `npuport port` validates it on its forward outputs, and the bundle's run.py runs it the same
    way (run.py is written beside the harness, so it needs the same fallback: it called model.generate)."""
    from tests.conftest import REPO_ROOT

    model = tmp_path / "convlm"
    model.mkdir()
    for name, text in (("config.json", CONV_CONFIG), ("configuration_conv.py", CONV_CONFIGURATION),
                       ("modeling_conv.py", CONV_MODELING)):
        (model / name).write_text(text)
    out = tmp_path / "bundle"
    env = dict(os.environ, NPUPORT_HOME=str(sim_home), NPUPORT_SERVE="0", COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "api.cli", "port", str(model), "--target", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    if "has no generate in this transformers release" not in (out / "report.md").read_text():
        pytest.skip("the port's transformers still gives PreTrainedModel a generate (< 4.50)")
    run = subprocess.run([sys.executable, str(out / "run.py"), "--target", "cpu", "--repeats", "1"],
                         capture_output=True, text=True, timeout=300, cwd=out)
    assert run.returncode == 0, run.stderr
    assert "ConvLM has no generate" in run.stderr and "output logits: shape (1, 8, 32)" in run.stdout


def test_a_wrapper_whose_preprocessing_path_generates_through_a_submodule_is_left_to_it() -> None:
    wrapper = nn.Module()  # no generate of its own: its chat calls its language model's
    wrapper.forward = lambda input_ids: input_ids  # type: ignore[method-assign]
    manifest = {"run": {"method": "generate", "preprocess": "chat", "kwargs": {"max_new_tokens": 4}}}
    assert present_run_method(wrapper, manifest) == (manifest, None)
