"""A CUDA-only package demanded at import (hazard H3, issue 25 class 5: rwkv5-world-hf's flash-rwkv): the
import sits in a try whose ``except ImportError`` raises again, after a version check through package
metadata. The scan calls it demanded (not guarded), the port's codemod makes the handler fall back, and
the reference run's stub answers the metadata query, so the original imports on the CPU as it does where
the package is installed. Harness runs go through real subprocesses."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agents.fixing import codemods as cm
from agents.reading.scanner import scan_source
from sandbox.cuda_redirect.redirect import STUB_VERSION
from tests.conftest import REPO_ROOT

MODELING = '''import importlib.metadata

import torch
from packaging.version import Version
from torch import nn

try:
    from flash_rwkv import rwkv5_cuda_linear_attention
    if Version(importlib.metadata.version("flash-rwkv")) < Version("0.2.1"):
        raise Exception("Your version of flash-rwkv is below 0.2.1")
except ImportError:
    raise ImportError("The flash-rwkv package is not detected. Please install it using pip install flash-rwkv.")
except importlib.metadata.PackageNotFoundError:
    raise ImportError("The flash-rwkv package is not detected.")


class TinyRwkv(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 16)
        self.head = nn.Linear(16, config["vocab"])

    def mix(self, x):
        if x.device.type == "cuda" and self.training:
            return rwkv5_cuda_linear_attention(x)
        return torch.cumsum(x, dim=1) / 2  # the torch recurrence

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.head(self.mix(self.emb(ids)))[:, -1].argmax(-1, keepdim=True)], dim=1)
        return ids


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab"], (1, 5), generator=g)}
'''

MANIFEST = {"name": "tiny-rwkv", "entry": {"class": "modeling_rwkv:TinyRwkv"}, "config": "config.json",
            "inputs": "modeling_rwkv:make_inputs", "run": {"method": "generate", "kwargs": {"max_new_tokens": 4}}}


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


def _model(root: Path, source: str) -> Path:
    root.mkdir(parents=True)
    (root / "modeling_rwkv.py").write_text(source)
    (root / "config.json").write_text(json.dumps({"vocab": 32}))
    return root


def test_a_demanded_cuda_only_import_is_found_and_its_handler_falls_back() -> None:
    findings = [f for f in scan_source(MODELING, "modeling_rwkv.py") if f.hazard == "H3"]
    demanded = [f for f in findings if f.rule == "cuda-only-import-demanded"]
    assert [f.line for f in demanded] == [8] and demanded[0].fixable
    assert not any(f.rule == "cuda-only-import-guarded" for f in findings)  # a handler that raises guards nothing
    result = cm.CODEMODS["guard-cuda-only-imports"][0](MODELING)
    ast.parse(result.source)
    assert "except ImportError:  # npuport (H3)" in result.source
    assert "rwkv5_cuda_linear_attention = _NpuportMissing('flash_rwkv.rwkv5_cuda_linear_attention')" in result.source
    assert 'raise ImportError("The flash-rwkv package is not detected.")' in result.source  # other handler kept
    assert "falls back instead of raising" in " ".join(result.edits)
    # a try whose handler falls back already is left as written
    guarded = "try:\n    import triton\nexcept ImportError:\n    triton = None\n"
    assert not cm.CODEMODS["guard-cuda-only-imports"][0](guarded).changed


def test_the_reference_stub_answers_the_version_check_and_the_port_falls_back(tmp_path: Path) -> None:
    original = _model(tmp_path / "original", MODELING)
    reference = _harness(original, tmp_path, redirect="cuda->cpu")  # the reference: unpatched, stubbed
    assert reference["ok"], reference["exception"]
    assert reference["stubbed_modules"] == ["flash_rwkv"]
    patched = _model(tmp_path / "patched", cm.CODEMODS["guard-cuda-only-imports"][0](MODELING).source)
    port = _harness(patched, tmp_path)  # the port: no stubs, no flash-rwkv installed
    assert port["ok"], port["exception"]
    assert port["outputs"]["tokens"] == reference["outputs"]["tokens"]
    # before: the port as written refuses to import (the handler raises again)
    before = _harness(original, tmp_path)
    assert not before["ok"] and "flash-rwkv package is not detected" in before["exception"]["message"]
    assert "+npuport.stub" in STUB_VERSION  # the stub's metadata says what it is
