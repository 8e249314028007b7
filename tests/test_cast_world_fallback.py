"""H12's cast policy per chip, the single-process world that lets models calling collectives validate, and
H7's fallback ops read from the op-support matrix. The codemods run original vs rewritten (meaning tests)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.reading.scanner import scan_source
from agents.rules.h9_distributed import nccl_to_hccl
from agents.rules.h12_half_precision import cast_policy, fp16_cast_policy
from sandbox.targets import Target
from sandbox.targets import registry as targets
from sandbox.targets.base import Chip

ROOT = Path(__file__).resolve().parents[1]


# --- H12: cast policy per chip ---------------------------------------------------------------------

@pytest.mark.parametrize("chip", ["910b", "a3", "310p"])
def test_ascend_chips_compute_float16_so_the_policy_keeps_it(chip: str) -> None:
    dtype, why = cast_policy(Target("ascend-sim", "npu", options={"chip": chip}))
    assert dtype == "float16" and "chip registry" in why and chip in why


def test_a_chip_without_float16_compute_gets_bfloat16_else_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    chips = dict(targets.CHIPS)
    chips["bf16only"] = Chip(key="bf16only", product="test chip", memory_gib=1.0, dtypes=("float32", "bfloat16"),
                             op_support="test", serve_dtype="bfloat16")
    chips["fp32only"] = Chip(key="fp32only", product="test chip", memory_gib=1.0, dtypes=("float32",),
                             op_support="test", serve_dtype="float32")
    monkeypatch.setattr(targets, "CHIPS", chips)
    dtype, why = cast_policy(Target("ascend-sim", "npu", options={"chip": "bf16only"}))
    assert dtype == "bfloat16" and "no float16 compute" in why
    assert cast_policy(Target("ascend-sim", "npu", options={"chip": "fp32only"}))[0] == "float32"


def test_cpu_policy_names_the_cpu_facts_it_read() -> None:
    dtype, why = cast_policy(Target("cpu", "cpu"))
    assert "CPU float16 units:" in why and "float16 kernels" in why
    assert (dtype == "float16") == ("float16 units: none" not in why
                                    and "kernels (matmul, softmax, layer_norm) run" in why)


def test_keeping_float16_changes_nothing_and_says_why() -> None:
    src = "import torch\nm = torch.nn.Linear(2, 2).half()\n"
    out = fp16_cast_policy(src, target=Target("ascend-sim", "npu", options={"chip": "310p"}))
    assert not out.changed and out.source == src and "keep float16" in out.edits[0]


_FP16_MODEL = '''
import torch
torch.manual_seed(0)
lin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
lin = lin.half()
x = torch.randn(3, 8).to(torch.float16)
with torch.autocast("cpu", dtype=torch.float16, enabled=True):
    y = lin(x)
RESULT = y.float()
'''


@pytest.mark.meaning("fp16-cast-policy")
@pytest.mark.parametrize(("dtype", "tol"), [("bfloat16", 5e-2), ("float32", 1e-2)])
def test_cast_policy_rewrite_computes_the_same_model(dtype: str, tol: float) -> None:
    out = fp16_cast_policy(_FP16_MODEL, dtype=dtype)
    assert out.changed and "float16" not in out.source.replace(f"torch.{dtype}", "")
    ran: dict[str, Any] = {}
    for name, src in (("orig", _FP16_MODEL), ("port", out.source)):
        ns: dict[str, Any] = {}
        exec(compile(src, f"{name}.py", "exec"), ns)
        ran[name] = ns["RESULT"]
    ref = ran["orig"]
    assert ran["port"].shape == ref.shape
    assert torch.allclose(ran["port"], ref, atol=tol, rtol=tol), (ran["port"] - ref).abs().max()


# --- H9: collectives validate on a single-process world ----------------------------------------------

_DIST_MODEL = '''
import torch
import torch.distributed as dist

def run():
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl", init_method="env://")
    x = torch.arange(6.0).reshape(2, 3)
    dist.all_reduce(x)
    parts = [torch.empty(2, 3) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x * 2)
    out = torch.empty(2, 3)
    dist.reduce_scatter_tensor(out, x + 1)
    work = dist.broadcast(x, src=0, async_op=True)
    work.wait()
    return [x.tolist(), parts[0].tolist(), out.tolist(), dist.get_world_size(), dist.get_rank()]
'''


def _run_world(tmp: Path, source: str) -> str:
    (tmp / "dist_mod.py").write_text(source)
    code = (f"import sys\nsys.path.insert(0, {str(tmp)!r})\nfrom sandbox.cuda_redirect.redirect import "
            "install_single_process_world\ninstall_single_process_world()\nimport "
            "dist_mod\nprint(repr(dist_mod.run()))\n")
    env = {"PATH": "/usr/bin:/bin"}  # no MASTER_ADDR / WORLD_SIZE: a validation run
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.meaning("nccl-to-hccl")
def test_nccl_to_hccl_runs_the_same_collectives_on_a_world_of_one(tmp_path: Path) -> None:
    port = nccl_to_hccl(_DIST_MODEL)
    assert port.changed and '"nccl"' not in port.source
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    original, ported = _run_world(tmp_path / "a", _DIST_MODEL), _run_world(tmp_path / "b", port.source)
    x = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    # one rank: all_reduce leaves x, all_gather copies it into place, reduce_scatter hands back the input
    assert original == ported == repr([x, [[2 * v for v in r] for r in x], [[v + 1 for v in r] for r in x], 1, 0])


def test_a_multi_process_launch_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import torch.distributed as dist\nfrom sandbox.cuda_redirect.redirect import "
            "install_single_process_world\nprint(install_single_process_world(), dist.init_process_group.__module__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PATH": "/usr/bin:/bin", "WORLD_SIZE": "2"}, timeout=120)
    assert r.stdout.split() == ["False", "torch.distributed.distributed_c10d"], r.stderr[-1000:]


# --- H7: ops that fall back, from the op matrix -------------------------------------------------------

@pytest.fixture()
def matrix(sim_home: Path) -> Any:
    from knowledge.op_matrix import load_or_build

    try:
        return load_or_build("2.13.0")
    except Exception as exc:  # noqa: BLE001 - the wheel is outside our walls
        pytest.skip(f"no torch_npu 2.13.0 op matrix here: {exc}")


def test_fallback_ops_come_from_the_matrix_with_their_status(matrix: Any) -> None:
    fallback = [op for op in ("sinc", "isneginf", "polar") if op in matrix.ops and matrix.ops[op].get("fallback")]
    kernel = [op for op in ("bincount", "isfinite", "cat") if matrix.has_npu_kernel(op)]
    assert fallback and kernel  # the 2.13.0 wheel warns about these / registers those
    lines = "\n".join(f"y{i} = torch.{op}(x, x)" if op == "polar" else f"y{i} = torch.{op}(x)"
                      for i, op in enumerate(fallback + kernel))
    src = f"import torch\nx = torch.ones(2)\n{lines}\nz = x.sinc()\n"
    found = {f.line: f for f in scan_source(src, "m.py") if f.hazard == "H7"}
    assert sorted(found) == [3 + i for i in range(len(fallback))] + [3 + len(fallback) + len(kernel)]
    first = found[3]
    assert f"aten::{fallback[0]}" in first.message and "falls back to the CPU" in first.message
    assert "torch_npu 2.13.0" in first.message and "wheel" in first.message


def test_without_a_stored_matrix_h7_reports_nothing(npuport_home: Path) -> None:
    assert not [f for f in scan_source("import torch\ny = torch.sinc(torch.ones(2))\n", "m.py") if f.hazard == "H7"]


def test_reference_world_and_record_stream_under_the_cuda_redirect(tmp_path: Path) -> None:
    src = textwrap.dedent('''
        import torch
        def run():
            s = torch.cuda.Stream()
            out = torch.ones(2).cuda()
            torch.cuda.nvtx.range_push("x")
            out.record_stream(torch.cuda.current_stream())
            torch.cuda.nvtx.range_pop()
            return out.tolist()
    ''')
    (tmp_path / "ref_mod.py").write_text(src)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nfrom sandbox.cuda_redirect import "
            "redirect\nredirect.install('cpu')\nimport ref_mod\nprint(repr(ref_mod.run()))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[1.0, 1.0]", r.stderr[-1500:]


# --- meaning tests of the remaining correctness codemods ----------------------------------------------

@pytest.mark.meaning("float64-to-float32")
def test_float64_to_float32_computes_the_same_values_to_float32_precision() -> None:
    from agents.rules.h5_dtypes import float64_to_float32

    src = ("import torch\ndef run(x):\n    t = torch.linspace(0, 1, 16, dtype=torch.float64)\n"
           "    w = x.double() * t.sin()\n    return (w @ w.T).cumsum(0)\n")
    out = float64_to_float32(src)
    assert out.changed and "float64" not in out.source and "double" not in out.source
    x = torch.randn(3, 16)
    ns_a: dict[str, Any] = {}
    ns_b: dict[str, Any] = {}
    exec(compile(src, "a.py", "exec"), ns_a)
    exec(compile(out.source, "b.py", "exec"), ns_b)
    a, b = ns_a["run"](x), ns_b["run"](x)
    assert a.dtype == torch.float64 and b.dtype == torch.float32
    assert torch.allclose(b.double(), a, rtol=1e-5, atol=1e-5)


@pytest.mark.meaning("align-devices")
def test_align_devices_concatenates_the_same_values() -> None:
    from agents.rules.h11_latent import align_devices

    src = "import torch\ndef run(x, y):\n    return torch.cat([x, y * 2], dim=0)\n"
    out = align_devices(src, line=3)
    assert out.changed and "_npuport_same_device" in out.source
    x, y = torch.randn(2, 3), torch.randn(1, 3)
    ns_a: dict[str, Any] = {}
    ns_b: dict[str, Any] = {}
    exec(compile(src, "a.py", "exec"), ns_a)
    exec(compile(out.source, "b.py", "exec"), ns_b)
    assert torch.equal(ns_a["run"](x, y), ns_b["run"](x, y))


@pytest.mark.meaning("fp16-cast-policy")
def test_a_cast_that_follows_the_models_own_float16_is_left_as_written() -> None:
    """``if dtype in (torch.float16, torch.bfloat16): cache = cache.half()`` runs only when the model already is
    float16 (its config's torch_dtype, which the policy does not rewrite): rewriting it to float32 left a float32
    rotary cache beside float16 values ("Expected query, key, and value to have the same dtype", ChatGLM2 on the
    cpu target). A cast of the model's own choosing is still rewritten, and the rewrite runs."""
    src = ("import torch\n\n\ndef rotary_cache(x, dtype):\n    cache = torch.stack([x.cos(), x.sin()], -1)\n"
           "    if dtype in (torch.float16, torch.bfloat16):\n        cache = cache.half()\n    return cache\n\n\n"
           "def build():\n    return torch.nn.Linear(2, 2).half()\n")
    out = fp16_cast_policy(src, dtype="float32")
    assert out.changed and "cache = cache.half()" in out.source
    assert "torch.nn.Linear(2, 2).to(torch.float32)" in out.source
    ns: dict[str, Any] = {}
    exec(compile(out.source, "port.py", "exec"), ns)
    assert ns["rotary_cache"](torch.ones(2, dtype=torch.float16), torch.float16).dtype == torch.float16
    assert ns["build"]().weight.dtype == torch.float32
