"""Quantized releases (hazard H23, the run side; agents/reading/quant_path.py): a release whose constructor builds
quantized layers for CUDA-only kernels is ported and validated on its float path, the one its own code
offers (a quantizing subclass's float base, or the config value that switches the quantization off), and
the entry says plainly that the int kernels were not validated. Harness runs go through real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents.reading.entry import discover_entry
from tests.conftest import REPO_ROOT

CONFIG_PY = '''class QConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
'''

MODELING = '''import warnings

import torch
from torch import nn

from .configuration_q import QConfig


class QLM(nn.Module):
    config_class = QConfig

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mix = nn.Linear(config.hidden_size, config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size)
        if config.wbits not in [4, 8, 32]:
            warnings.warn("Specify wbits with 4, 8 or 32")
        if config.wbits in [4, 8]:
            self.quantize(config.wbits)

    def quantize(self, bits):
        from .quant import make_quant
        make_quant(self, bits)

    def forward(self, input_ids):
        return self.head(torch.tanh(self.mix(self.emb(input_ids))))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4, **kwargs):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.forward(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


class QLM4bit(QLM):
    def __init__(self, config):
        QLM.__init__(self, config)
        try:
            import bitsandbytes
            from .quant import quantize_offline
            quantize_offline(self)
        except ImportError:
            raise ImportError("Needs bitsandbytes to run quantize.")


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 5), generator=g)}
'''

QUANT_PY = '''import torch
import triton


class QuantLinear(torch.nn.Module):
    def __init__(self, linear, bits):
        super().__init__()
        self.bits = bits
        self.register_buffer("qweight", torch.zeros(linear.out_features, linear.in_features, dtype=torch.int8))

    def forward(self, x):
        return triton.ops.matmul_248(x, self.qweight, self.bits)  # CUDA-only kernel


def make_quant(model, bits):
    model.mix = QuantLinear(model.mix, bits)


def quantize_offline(model):
    make_quant(model, 4)
'''


def _release(root: Path, entry: str, **config: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "configuration_q.py").write_text(CONFIG_PY)
    (root / "modeling_q.py").write_text(MODELING)
    (root / "quant.py").write_text(QUANT_PY)
    (root / "config.json").write_text(json.dumps({
        "auto_map": {"AutoConfig": "configuration_q.QConfig", "AutoModelForCausalLM": f"modeling_q.{entry}"},
        "vocab_size": 64, "hidden_size": 32, **config}))
    return root


def _harness(model: Path, manifest: dict[str, Any], tmp_path: Path, **spec: Any) -> dict[str, Any]:
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    run_dir.mkdir()
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps({"model_dir": str(model), "manifest": manifest, "device": "cpu", "seed": 0,
                                     "result_path": str(run_dir / "result.json"), "redirect": "cuda->cpu", **spec}))
    subprocess.run([sys.executable, "-I", "-B", "-m", "sandbox.harness.worker", str(spec_path)], cwd=run_dir,
                   capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    result: dict[str, Any] = json.loads((run_dir / "result.json").read_text())
    return result


def test_a_config_switch_runs_with_the_value_the_code_accepts_and_the_entry_says_so(tmp_path: Path) -> None:
    model = _release(tmp_path / "int8", "QLM", wbits=8)
    entry = discover_entry(model)
    assert entry.class_name == "QLM" and entry.config_overrides == {"wbits": 32}  # 32: the code's own float value
    quant = entry.quantized or {}
    assert quant["sites"] == ["modeling_q.py:21"] and "triton" in quant["scheme"]
    said = next(a for a in entry.assumptions if a.startswith("quantized checkpoint"))
    assert "built with wbits=32, which skips the quantization" in said
    assert "quantized kernels" in said and "were not run or validated" in said
    assert "npu_weight_quant_batchmatmul" in said  # the Ascend recipe for the real int8 weights
    manifest = entry.as_manifest_dict()
    assert manifest["config_overrides"] == {"wbits": 32}

    ran = _harness(model, manifest, tmp_path)
    assert ran["ok"], ran["exception"]
    assert ran["outputs"]["tokens"] and len(ran["outputs"]["tokens"][0]) == 5 + 8
    shrunk = _harness(model, manifest, tmp_path, shrink=True)  # the constructor-fitted shrink keeps the override
    assert shrunk["ok"], shrunk["exception"] and shrunk["shrunk_config"]["wbits"] == 32
    # Without the override (what the port ran before): the int8 layers call the CUDA-only kernel
    before = _harness(model, {k: v for k, v in manifest.items() if k != "config_overrides"}, tmp_path)
    assert not before["ok"] and "triton" in before["exception"]["message"]


def test_a_quantizing_subclass_is_built_from_its_float_base(tmp_path: Path) -> None:
    model = _release(tmp_path / "int4", "QLM4bit", wbits=32)
    entry = discover_entry(model)
    assert entry.class_name == "QLM" and entry.config_overrides == {}
    quant = entry.quantized or {}
    assert quant["float_class"] == "QLM" and quant["entry_class"] == "QLM4bit"
    assert quant["sites"] == ["modeling_q.py:44"]  # the quantize_offline(self) call in QLM4bit.__init__
    assert "QLM, the class QLM4bit derives from without its quantizing constructor" in quant["validated"]
    ran = _harness(model, entry.as_manifest_dict(), tmp_path)
    assert ran["ok"], ran["exception"]
    before = _harness(model, {**entry.as_manifest_dict(), "entry": {"class": "modeling_q:QLM4bit"}}, tmp_path)
    # before: the 4-bit class swaps its layers for ones whose forward is a CUDA-only kernel
    assert not before["ok"] and "CUDA-only" in before["exception"]["message"]


def test_a_float_release_and_a_switch_left_off_are_not_quantized(tmp_path: Path) -> None:
    entry = discover_entry(_release(tmp_path / "float", "QLM", wbits=32))
    assert entry.quantized is None and entry.config_overrides == {}
    assert "config_overrides" not in entry.as_manifest_dict()
    # a truthiness switch (`if self.config.quantization_bit:`) turned off with a falsy value
    root = _release(tmp_path / "bit", "QLM", wbits=32, quantization_bit=4)
    src = (root / "modeling_q.py").read_text().replace(
        "        if config.wbits in [4, 8]:\n", "        if self.config.quantization_bit:\n")
    (root / "modeling_q.py").write_text(src)
    assert discover_entry(root).config_overrides == {"quantization_bit": 0}


def test_a_checkpoint_quantized_in_its_files_only_is_labelled(tmp_path: Path) -> None:
    root = _release(tmp_path / "gptq", "QLM", wbits=32)
    (root / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    entry = discover_entry(root)
    assert entry.class_name == "QLM" and entry.config_overrides == {}
    assert (entry.quantized or {})["scheme"] == "GPTQ 4-bit weights (quantize_config.json)"
    assert "the checkpoint's quantization is data" in (entry.quantized or {})["validated"]
