"""`npuport ops`: the op inventory of an unported model on ascend-sim, with planted problems caught
in the exact torch_npu message text (../shared/data/npu_runtime_facts.md), and `ops matrix`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO_ROOT
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.slow


def ops(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NPUPORT_HOME=str(home), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "api.cli", "ops", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=REPO_ROOT)


def test_matrix_summary(sim_home: Path) -> None:
    r = ops("matrix", "--torch-npu", "2.13.0", home=sim_home)
    if r.returncode != 0 and "registry" in r.stderr.lower():
        pytest.skip(f"the package registry cannot be reached: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert "torch_npu 2.13.0" in r.stdout and "aten ops run on the NPU" in r.stdout


def test_inventory_of_the_unported_example(sim_home: Path) -> None:
    r = ops(str(EXAMPLES / "ocr_mini"), "--json", home=sim_home)
    assert r.returncode == 0, r.stderr
    inv = json.loads(r.stdout)
    st = inv["op_stats"]
    assert inv["ok"] and st["target"] == "ascend-sim" and st["matrix"].endswith("torch_npu-2.13.0.json")
    assert st["fallbacks"] == {}
    # The float64 rotary tables are downcast, with torch_npu's exact warning.
    assert {e["site"] for e in st["dtype_events"]} == {"modeling_ocr_mini.py:261", "modeling_ocr_mini.py:262"}
    assert "UserWarning: Device do not support double dtype now, dtype cast replace with float." in inv["warnings"]
    # Host syncs of the MoE routing (.cpu().numpy() and .item()) are found at their lines, every step.
    sites = st["host_syncs"]["sites"]
    assert sites["modeling_ocr_mini.py:367"] == 16 and sites["modeling_ocr_mini.py:372"] == 64
    assert len(st["steps"]) == 8 and all(s["host_syncs"] == 10 for s in st["steps"])


FALLBACK_TWIST = "flags = torch.isneginf(self.head.weight).sum()"
CAUTION = ("CAUTION: The operator 'aten::isneginf' is not currently supported on the NPU backend and will fall "
           "back to run on the CPU. This may have performance implications.")


def test_planted_fallback_op_is_counted_with_its_call_site(tmp_path: Path, sim_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m", twist=FALLBACK_TWIST)
    r = ops(str(model), "--json", home=sim_home)
    assert r.returncode == 0, r.stderr
    inv = json.loads(r.stdout)
    fb = inv["op_stats"]["fallbacks"]
    assert "aten::isneginf" in fb and fb["aten::isneginf"]["count"] == 4
    assert list(fb["aten::isneginf"]["sites"]) == ["modeling_tiny.py:20"]
    assert f"UserWarning: {CAUTION}" in inv["warnings"]


def test_strict_mode_raises_the_exact_message(tmp_path: Path, sim_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m", twist=FALLBACK_TWIST)
    r = ops(str(model), "--strict", "--json", home=sim_home)
    assert r.returncode == 1
    inv = json.loads(r.stdout)
    assert not inv["ok"]
    assert ("The operator 'aten::isneginf' would execute its main computation on CPU through dispatcher backend "
            "fallback because no kernel is registered for the NPU PrivateUse1 backend, but CPU fallback is disabled "
            "by TORCH_NPU_FALLBACK_CPU_DISABLE=1.") in inv["error"]


def test_bf16_on_310p_fails_and_passes_on_910b(tmp_path: Path, sim_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m", twist="nxt = (self.emb.weight.to(torch.bfloat16).sum() * 0).long() + nxt")
    ok = json.loads(ops(str(model), "--json", "--chip", "910b", home=sim_home).stdout)
    assert ok["ok"], ok["error"]
    bad = json.loads(ops(str(model), "--json", "--chip", "310p", home=sim_home).stdout)
    assert not bad["ok"] and "not implemented for DT_BFLOAT16, should be in dtype support list" in bad["error"]
