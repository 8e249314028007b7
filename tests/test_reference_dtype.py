"""A model that builds parts in half precision for a GPU and autocasts only off the CPU (a vision tower made
float16 in __init__, ``maybe_autocast`` that does nothing on the CPU): on the CPU, the reference (cuda
redirected) and a cpu-target run, it fails with "Input type (float) and bias type (c10::Half)"; the harness
runs it all in float32 there and says so (sandbox/harness/worker.py). Real harness subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents.reading.entry import discover_entry
from tests.conftest import REPO_ROOT

MODELING = '''import contextlib

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class HalfConfig(PretrainedConfig):
    model_type = "half_parts_synthetic"

    def __init__(self, vocab_size=64, hidden_size=32, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)


class HalfPartsModel(PreTrainedModel):
    config_class = HalfConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.vision = nn.Conv1d(3, config.hidden_size, 1).to(torch.float16)  # built for a GPU

    def maybe_autocast(self):
        # the authors' code: autocast on a GPU, nothing on the CPU
        on_gpu = self.device != torch.device("cpu")
        return torch.autocast("cuda", dtype=torch.float16) if on_gpu else contextlib.nullcontext()

    def forward(self, input_ids, pixels):
        with self.maybe_autocast():
            seen = self.vision(pixels).mean(-1)
        return {"hidden": self.embed(input_ids).mean(1) + seen.float()}


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 5), generator=g),
            "pixels": torch.randn(1, 3, 4, generator=g)}
'''


def _release(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "modeling_half.py").write_text(MODELING)
    (root / "config.json").write_text(json.dumps({
        "auto_map": {"AutoConfig": "modeling_half.HalfConfig", "AutoModel": "modeling_half.HalfPartsModel"},
        "model_type": "half_parts_synthetic", "vocab_size": 64, "hidden_size": 32}))
    return root


def _harness(model: Path, manifest: dict[str, Any], run_dir: Path, **spec: Any) -> dict[str, Any]:
    run_dir.mkdir()
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps({"model_dir": str(model), "manifest": manifest, "seed": 0,
                                     "result_path": str(run_dir / "result.json"), **spec}))
    subprocess.run([sys.executable, "-I", "-B", "-m", "sandbox.harness.worker", str(spec_path)], cwd=run_dir,
                   capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    return result


def test_parts_built_in_half_for_a_gpu_run_in_float32_on_the_cpu(tmp_path: Path) -> None:
    model = _release(tmp_path / "release")
    manifest = discover_entry(model).as_manifest_dict()
    assert manifest["run"]["method"] == "forward"
    reference = _harness(model, manifest, tmp_path / "reference", device="cpu", redirect="cuda->cpu")
    assert reference["ok"], reference["exception"]
    assert any("float16/float32 for a GPU; on the CPU it runs all in float32" in w for w in reference["warnings"])
    port_on_cpu = _harness(model, manifest, tmp_path / "cpu", device="cpu")
    assert port_on_cpu["ok"], port_on_cpu["exception"]
    assert port_on_cpu["outputs"]["digest"] == reference["outputs"]["digest"]
    # asked for a dtype (a port's bf16 run), the harness leaves the model to that dtype, not to float32
    asked = _harness(model, manifest, tmp_path / "asked", device="cpu", dtype="float16")
    assert not any("runs all in float32" in w for w in asked.get("warnings") or [])
