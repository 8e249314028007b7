"""The random-weight build as a checkpoint load would leave it (sandbox/harness/init_shapes.py,
sandbox/harness/worker.py):
a model's ``_init_weights`` that reshapes a parameter (it runs only for weights a checkpoint lacks) is
undone in layout, and a config class that pops its sub-config dicts is built from a copy each time (the
constructor fit builds it several times). Harness runs go through real subprocesses, shrunk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT

MODELING = '''import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel


class DecayConfig(PretrainedConfig):
    model_type = "decay-toy"

    def __init__(self, vocab_size=64, hidden_size=512, num_attention_heads=8, num_hidden_layers=4, head_size=64,
                 parts=None, **kwargs):
        self.vocab_size, self.hidden_size, self.head_size = vocab_size, hidden_size, head_size
        self.num_attention_heads, self.num_hidden_layers = num_attention_heads, num_hidden_layers
        parts = dict(parts or {"mixer": {"kind": "decay", "scale": 2}})
        self.mixer_kind = parts["mixer"].pop("kind")  # consumes the dict it is given
        self.mixer_scale = parts["mixer"]["scale"]
        super().__init__(**kwargs)


class Decay(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.time_decay = nn.Parameter(torch.empty(1, 1, config.hidden_size))
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.heads = config.hidden_size // config.head_size

    def forward(self, x):
        return self.proj(x) * torch.sigmoid(self.time_decay)


class DecayLM(PreTrainedModel, GenerationMixin):
    config_class = DecayConfig

    def __init__(self, config):
        super().__init__(config)
        self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Decay(config) for _ in range(config.num_hidden_layers))
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, Decay):
            speed = torch.linspace(-6.0, -1.0, module.time_decay.numel())
            module.time_decay.data = speed.reshape(module.heads, -1)  # per head: not the constructor's layout

    def forward(self, input_ids, **kwargs):
        x = self.emb(input_ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4, **kwargs):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.forward(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 5), generator=g)}
'''

MANIFEST = {"name": "decay", "entry": {"class": "modeling_decay:DecayLM"}, "config": "config.json",
            "inputs": "modeling_decay:make_inputs", "run": {"method": "generate", "kwargs": {"max_new_tokens": 4}}}


def _harness(model: Path, tmp_path: Path, **spec: Any) -> dict[str, Any]:
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    run_dir.mkdir()
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps({"model_dir": str(model), "manifest": MANIFEST, "device": "cpu", "seed": 0,
                                     "result_path": str(run_dir / "result.json"), **spec}))
    subprocess.run([sys.executable, "-I", "-B", "-m", "sandbox.harness.worker", str(spec_path)], cwd=run_dir,
                   capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    return result


def test_a_weight_init_that_reshapes_a_parameter_is_undone_in_layout_and_sub_configs_are_copied(
    tmp_path: Path
) -> None:
    model = tmp_path / "decay"
    model.mkdir()
    (model / "modeling_decay.py").write_text(MODELING)
    (model / "config.json").write_text(json.dumps({
        "vocab_size": 64, "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 4, "head_size": 64,
        "parts": {"mixer": {"kind": "decay", "scale": 2}}}))
    ran = _harness(model, tmp_path, shrink=True)
    assert ran["ok"], ran["exception"]
    restored = [c for c in ran["shrunk"] if "weight init gave it shape" in c]
    assert restored and restored[0].startswith("layers.0.time_decay: the model's weight init gave it shape (4, 64), "
                                               "its constructor (1, 1, 256)")
    assert len(ran["outputs"]["tokens"][0]) == 5 + 4
    assert ran["shrunk_config"]["parts"]["mixer"]["kind"] == "decay"  # every build read an intact sub-config
    # before: built as the harness built it (the model's init on every module), the forward breaks
    sys.path.insert(0, str(model))
    try:
        import importlib

        import torch

        mod = importlib.import_module("modeling_decay")
        lm = mod.DecayLM(mod.DecayConfig(hidden_size=256, num_attention_heads=4, head_size=64))
        assert tuple(lm.layers[0].time_decay.shape) == (4, 64)
        try:
            lm(torch.zeros((1, 3), dtype=torch.long))
            raise AssertionError("the init's layout should break the forward")
        except RuntimeError as exc:
            assert "must match the size" in str(exc)
        from sandbox.harness.init_shapes import constructor_shapes, restore_constructor_shapes

        shapes = constructor_shapes(mod.DecayLM, lambda: mod.DecayLM(mod.DecayConfig(hidden_size=256,
                                                                                    num_attention_heads=4,
                                                                                    head_size=64)))
        assert shapes["layers.0.time_decay"] == (1, 1, 256)
        assert len(restore_constructor_shapes(lm, shapes)) == 4  # every layer
        assert lm(torch.zeros((1, 3), dtype=torch.long)).shape == (1, 3, 64)
    finally:
        sys.path.remove(str(model))
        sys.modules.pop("modeling_decay", None)
