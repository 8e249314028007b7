"""ascend-sim as the libraries in a model's environment see it: transformers, accelerate, importlib.

Every case runs in a fresh interpreter with the emulator installed by the harness's bootstrap
(`sandbox.ascend_sim.install`). The models are transformers' own classes (Llama, Qwen2, Llava) built
from small configs with seeded random weights; what is faked is only the NPU hardware (the emulator).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_ascend_sim import SUFFIX, run_sim  # tests/ is on sys.path (pytest rootdir-relative import)

REPO = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("sim_hf_run.py")

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def _run(order: str, models: str, attns: str, engine: str = "auto") -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NPUPORT_SIM_ENGINE": engine, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(RUNNER), order, models, attns],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


@pytest.fixture(scope="module")
def sim_first() -> dict[str, Any]:
    return _run("sim-first", "llama,qwen2,llava", "eager,sdpa,flash_attention_2")


@pytest.fixture(scope="module")
def libs_first() -> dict[str, Any]:
    return _run("libs-first", "llama_padded", "eager,sdpa,flash_attention_2")


@pytest.mark.parametrize("order", ["sim_first", "libs_first"])
def test_libraries_detect_the_npu_in_either_import_order(order: str, request: pytest.FixtureRequest) -> None:
    out = request.getfixturevalue(order)
    assert out["find_spec"] is True
    assert out["torch_npu_version"] == "2.13.0"
    assert out["is_torch_npu_available"] is True
    assert out["accelerate_is_npu_available"] is True
    assert out["accelerate_device"] == "npu"
    assert out["accelerator"] == "npu"
    assert out["sdpa_npu_flag"] is True  # transformers' sdpa integration takes its npu branch


def _check_runs(out: dict[str, Any], expected: int) -> None:
    runs = out["runs"]
    assert len(runs) == expected
    for run in runs:
        label = f"{run['model']}/{run['attn']}"
        assert run["param_device"] == "npu:0", label
        assert run["npu"] == run["cpu"], label  # greedy tokens on the emulated npu == the CPU run
        assert run["op_total"] > 100, label  # the forward really ran on the device
        if run["attn"] == "flash_attention_2":
            # transformers' own Ascend path: integrations/npu_flash_attention -> torch_npu.npu_fusion_attention
            assert run["fusion_attention_calls"] > 0, label
        else:
            assert run["fusion_attention_calls"] == 0, label


def test_transformers_models_generate_the_cpu_tokens_on_the_npu(sim_first: dict[str, Any]) -> None:
    _check_runs(sim_first, 9)
    assert {r["model"] for r in sim_first["runs"]} == {"llama", "qwen2", "llava"}


def test_padded_batch_takes_the_varlen_flash_attention_path(libs_first: dict[str, Any]) -> None:
    _check_runs(libs_first, 3)


def test_python_engine_runs_transformers_paths_too() -> None:
    out = _run("sim-first", "qwen2", "sdpa,flash_attention_2", engine="python")
    _check_runs(out, 2)


def test_import_surface_is_real_modules_with_specs_and_metadata() -> None:
    out = run_sim(
        """
        import importlib, importlib.metadata, importlib.util
        import torch_npu
        OUT["spec"] = importlib.util.find_spec("torch_npu") is not None
        OUT["spec_attr"] = torch_npu.__spec__.name
        OUT["version"] = [torch_npu.__version__, importlib.metadata.version("torch-npu"),
                          importlib.metadata.version("torch_npu")]
        OUT["dist_top"] = importlib.metadata.packages_distributions().get("torch_npu")
        OUT["subs"] = {}
        for name in ["torch_npu.npu", "torch_npu.npu.amp", "torch_npu.contrib", "torch_npu.utils", "torch_npu.optim"]:
            m = importlib.import_module(name)
            OUT["subs"][name] = m.__spec__ is not None and importlib.util.find_spec(name) is not None
        OUT["device_module"] = [torch.npu is torch_npu.npu, torch.get_device_module("npu") is torch_npu.npu,
                                str(torch.accelerator.current_accelerator()), torch.accelerator.device_count()]
        from torch_npu.optim import NpuFusedAdamW
        OUT["adamw"] = issubclass(NpuFusedAdamW, torch.optim.AdamW)
        errs = []
        try:
            torch_npu.npu_not_an_api
        except AttributeError as e:
            errs.append(str(e))
        try:
            import torch_npu.not_a_module
        except ModuleNotFoundError as e:
            errs.append(str(e))
        try:
            from torch_npu import not_a_name
        except ImportError as e:
            errs.append(str(e).split(" (")[0])
        try:
            torch.npu.not_an_api
        except AttributeError as e:
            errs.append(str(e))
        OUT["errs"] = errs
        OUT["cuda_before"] = torch.cuda.is_available()
        from torch_npu.contrib import transfer_to_npu
        OUT["cuda_after"] = [torch.cuda.is_available(), str(torch.ones(1, device="cuda").device)]
        """
    )
    assert out["spec"] and out["spec_attr"] == "torch_npu"
    assert out["version"] == ["2.13.0"] * 3
    assert out["dist_top"] == ["torch-npu"]
    assert all(out["subs"].values()), out["subs"]
    assert out["device_module"] == [True, True, "npu", 1]
    assert out["adamw"] is True
    assert out["errs"] == [
        "module 'torch_npu' has no attribute 'npu_not_an_api'",
        "No module named 'torch_npu.not_a_module'",
        "cannot import name 'not_a_name' from 'torch_npu'",
        "module 'torch_npu.npu' has no attribute 'not_an_api'",
    ]
    assert out["cuda_before"] is False
    assert out["cuda_after"] == [True, "npu:0"]


def test_fused_ops_apply_the_real_ops_argument_checks() -> None:
    out = run_sim(
        """
        import torch_npu
        q = torch.randn(1, 4, 2, 8, device="npu")
        errs = {}
        cases = {
            "int_query": lambda: torch_npu.npu_fusion_attention(q.to(torch.int32), q, q, 2, "BSND"),
            "mixed_dtype": lambda: torch_npu.npu_fusion_attention(q, q.half(), q.half(), 2, "BSND"),
            "head_num": lambda: torch_npu.npu_fusion_attention(q, q, q, 3, "BSND"),
            "rank": lambda: torch_npu.npu_fusion_attention(q[0], q[0], q[0], 2, "BSND"),
            "head_dim": lambda: torch_npu.npu_fusion_attention(
                torch.randn(1, 1, 1, 800, device="npu"), torch.randn(1, 1, 1, 800, device="npu"),
                torch.randn(1, 1, 1, 800, device="npu"), 1, "BSND"),
            "tnd_lengths": lambda: torch_npu.npu_fusion_attention(q[0], q[0], q[0], 2, "TND",
                                                                  actual_seq_qlen=[3], actual_seq_kvlen=[4]),
            "add_rms_gamma": lambda: torch_npu.npu_add_rms_norm(q, q, torch.ones(4, device="npu")),
            "rms_dtype": lambda: torch_npu.npu_rms_norm(q.to(torch.int32), torch.ones(8, device="npu")),
        }
        for name, fn in cases.items():
            try:
                fn()
                errs[name] = None
            except RuntimeError as e:
                errs[name] = str(e)
        OUT["errs"] = errs
        # the varlen (TND) form: two sequences of 2 and 3 tokens == two separate BSND calls
        t = torch.randn(5, 2, 8, device="npu")
        mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device="npu"), diagonal=1)
        var = torch_npu.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=mask, sparse_mode=3, scale=0.3,
                                             actual_seq_qlen=[2, 5], actual_seq_kvlen=[2, 5])[0]
        parts = [torch_npu.npu_fusion_attention(x[None], x[None], x[None], 2, "BSND", atten_mask=mask,
                                                sparse_mode=3, scale=0.3)[0][0] for x in (t[:2], t[2:])]
        OUT["tnd_diff"] = float((var - torch.cat(parts)).abs().max().cpu())
        # documented: without atten_mask, sparse_mode does not apply (full attention)
        full = torch_npu.npu_fusion_attention(q, q, q, 2, "BSND", sparse_mode=3)[0]
        plain = torch_npu.npu_fusion_attention(q, q, q, 2, "BSND")[0]
        OUT["nomask_diff"] = float((full - plain).abs().max().cpu())
        """
    )
    errs = out["errs"]
    ez = r"NPU function error: call aclnn\w+ failed, error code is 161002" + SUFFIX
    for name, msg in errs.items():
        assert msg is not None, f"{name}: the real op rejects it"
        assert re.match(ez, msg), (name, msg)
        assert "AclNN_Parameter_Error(EZ1001)" in msg, (name, msg)
    assert "Tensor query not implemented for DT_INT32" in errs["int_query"]
    assert "head_num (3) must equal N of query (2)" in errs["head_num"]
    assert "Dq == Dk in [1, 768]" in errs["head_dim"]
    assert "aclnnFlashAttentionVarLenScore" in errs["tnd_lengths"]
    assert out["tnd_diff"] < 1e-5
    assert out["nomask_diff"] == 0.0


@pytest.mark.slow
def test_port_of_a_remote_code_model_that_imports_transformers_reaches_its_model_code(tmp_path: Path) -> None:
    """The failure of the issue: a remote-code-style folder (its own PretrainedConfig/PreTrainedModel on
    transformers, written for CUDA) died at `import transformers.activations` with `torch_npu.__spec__ is
    None` before any model code ran. Ported to ascend-sim it now runs and its greedy tokens match."""
    import shutil
    import tempfile

    from agents.workspace import tree_digest

    model = REPO / "tests" / "fixtures" / "hf_remote_tiny"
    before = tree_digest(model)
    # Not under /tmp: the bwrap sandbox mounts a fresh /tmp, which would hide the home's op matrix.
    base = Path.home() / ".cache" / "npuport-tests"
    base.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="home-", dir=base))
    try:
        env = {**os.environ, "NPUPORT_HOME": str(home), "COLUMNS": "200"}
        env.setdefault("NPUPORT_WHEEL_CACHE", str(base / "wheels"))
        out = tmp_path / "bundle"
        r = subprocess.run(
            [sys.executable, "-m", "api.cli", "port", str(model), "--target", "ascend-sim", "--out", str(out)],
            capture_output=True, text=True, timeout=900, env=env, cwd=REPO,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        report = json.loads((out / "report.json").read_text())
        port_run = [x for x in report["runs"] if x["purpose"] == "port"][-1]
        assert port_run["op_stats"]["target"] == "ascend-sim"
        assert port_run["op_stats"]["op_total"] > 0
        assert report["numerics"]["verdict"] == "match"
        assert "__spec__" not in r.stdout
        assert tree_digest(model) == before
    finally:
        shutil.rmtree(home, ignore_errors=True)
