"""The emulated Ascend runtime (sandbox/ascend_sim), each case in a fresh subprocess.

The emulator renames torch's PrivateUse1 backend and registers kernels (global, process-wide state),
so every case runs in its own interpreter and nothing leaks into other test files. Expected message
texts are those of a real torch_npu host (../shared/data/npu_runtime_facts.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

CAUTION = (
    "CAUTION: The operator 'aten::isneginf' is not currently supported on the NPU backend and will fall back "
    "to run on the CPU. This may have performance implications."
)
DOUBLE = "Device do not support double dtype now, dtype cast replace with float."
SUFFIX = (
    r"\n\[ERROR\] \d{4}-\d\d-\d\d-\d\d:\d\d:\d\d \(PID:\d+, Device:0, RankID:-1\) ERR\d{5} [A-Z]+ [a-z ]+"
)

PRELUDE = """
import json, sys, warnings
warnings.simplefilter("always")
import torch
from sandbox.ascend_sim import install, op_report, begin_step, end_step, reset
OUT = {}
def emit():
    print("@@JSON@@" + json.dumps(OUT, default=str))
"""


@pytest.fixture(autouse=True, params=["native", "python"])
def sim_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case runs on both engines: the C++ PrivateUse1 backend and the Python tensor subclass."""
    if request.param == "native":
        from sandbox.ascend_sim.native_build import choose_engine

        engine, _, why = choose_engine("auto")  # builds once per torch and source, then cached
        if engine != "native" and "no C++ compiler" in why:
            pytest.skip(why)
        assert engine == "native", why  # a compiler is here, so the build must work
    monkeypatch.setenv("NPUPORT_SIM_ENGINE", request.param)
    return str(request.param)


def run_sim(
    body: str, options: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run `body` after install(options) in a fresh interpreter; it fills OUT; returns OUT + stderr."""
    code = PRELUDE + f"install({options or {'chip': '910b'}!r})\n" + textwrap.dedent(body) + "\nemit()\n"
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("TORCH_NPU_FALLBACK_CPU_DISABLE", None) if not env else None
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@JSON@@")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"snippet failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out: dict[str, Any] = json.loads(lines[-1].removeprefix("@@JSON@@"))
    out["_stderr"] = proc.stderr
    return out


def _tiny_matrix(tmp_path: Path) -> str:
    """A matrix that has kernels for abs and add but not isneginf."""
    matrix = {
        "schema": 1,
        "torch_npu_version": "2.13.0",
        "torch_version": "2.13",
        "sources": [],
        "ops": {
            "abs": {"npu": True, "via": ["yaml"], "kernel": "op_api", "exec": "aclnnAbs", "dtypes": None},
            "add.Tensor": {
                "npu": True,
                "via": ["yaml"],
                "kernel": "op_api",
                "exec": "aclnnAdd",
                "dtypes": None,
            },
            "mul.Tensor": {
                "npu": True,
                "via": ["yaml"],
                "kernel": "op_api",
                "exec": "aclnnMul",
                "dtypes": ["DT_FLOAT", "DT_FLOAT16", "DT_BFLOAT16"],
            },
        },
        "fallback_ops": [],
        "custom_ops": ["npu_rms_norm"],
    }
    path = tmp_path / "torch_npu-2.13.0.json"
    path.write_text(json.dumps(matrix))
    return str(path)


FALLBACK_BODY = """
x = torch.randn(4).npu()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    torch.isneginf(x)
    torch.isneginf(x)
    x.abs()
OUT["warnings"] = [str(m.message) for m in w]
OUT["categories"] = [m.category.__name__ for m in w]
OUT["report"] = op_report()
"""


def test_fallback_warns_once_with_exact_text_and_counts_sites(tmp_path: Path) -> None:
    out = run_sim(FALLBACK_BODY, {"chip": "910b", "matrix_path": _tiny_matrix(tmp_path)})
    assert out["warnings"] == [CAUTION]
    assert out["categories"] == ["UserWarning"]
    rep = out["report"]
    assert rep["matrix"].endswith("torch_npu-2.13.0.json")
    fb = rep["fallbacks"]["aten::isneginf"]
    assert fb["count"] == 2
    # Both calls come from lines 5 and 6 of the snippet body (the innermost frame outside torch/sandbox).
    assert sorted(fb["sites"].values()) == [1, 1]
    assert all(site.startswith("<string>:") for site in fb["sites"])
    assert "aten::abs" in rep["npu_ops"] and "aten::abs" not in rep["fallbacks"]
    assert rep["warnings"] == [CAUTION]


def test_fallback_with_real_matrix_if_available() -> None:
    home = Path(os.environ.get("NPUPORT_HOME", Path.home() / ".npuport"))
    matrix = home / "matrices" / "torch_npu-2.13.0.json"
    if not matrix.is_file():
        pytest.skip("no real torch_npu 2.13.0 op matrix built in the npuport home")
    out = run_sim(FALLBACK_BODY, {"chip": "910b", "matrix_path": str(matrix)})
    assert CAUTION in out["warnings"]
    assert out["report"]["fallbacks"]["aten::isneginf"]["count"] == 2


def test_builtin_policy_is_reported_and_falls_back_on_isneginf() -> None:
    out = run_sim(FALLBACK_BODY)
    assert out["warnings"] == [CAUTION]
    rep = out["report"]
    assert rep["matrix"] == "builtin"
    assert "isneginf" in rep["matrix_note"]
    assert rep["target"] == "ascend-sim" and rep["chip"] == "910b" and rep["torch_npu"] == "2.13.0"


STRICT_BODY = """
x = torch.randn(4).npu()
try:
    torch.isneginf(x)
except RuntimeError as e:
    OUT["error"] = str(e)
OUT["fallbacks"] = op_report()["fallbacks"]
"""
STRICT_RE = (
    re.escape(
        "The operator 'aten::isneginf' would execute its main computation on CPU through dispatcher backend "
        "fallback because no kernel is registered for the NPU PrivateUse1 backend, but CPU fallback is disabled "
        "by TORCH_NPU_FALLBACK_CPU_DISABLE=1."
    )
    + SUFFIX
    + "$"
)


def test_strict_option_raises_exact_message() -> None:
    out = run_sim(STRICT_BODY, {"chip": "910b", "strict": True})
    assert re.match(STRICT_RE, out["error"]), out["error"]
    assert out["fallbacks"] == {}


def test_strict_env_variable_raises_exact_message() -> None:
    out = run_sim(STRICT_BODY, {"chip": "910b"}, env={"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"})
    assert re.match(STRICT_RE, out["error"]), out["error"]


def test_float64_downcasts_with_one_warning() -> None:
    out = run_sim(
        """
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            a = torch.ones(3, dtype=torch.float64).npu()
            b = torch.ones(3).npu().double()
            c = torch.zeros(2, dtype=torch.float64, device="npu")
        OUT["dtypes"] = [str(t.dtype) for t in (a, b, c)]
        OUT["warnings"] = [str(m.message) for m in w]
        OUT["events"] = op_report()["dtype_events"]
        """
    )
    assert out["dtypes"] == ["torch.float32"] * 3
    assert out["warnings"] == [DOUBLE]
    assert {e["kind"] for e in out["events"]} == {"double_downcast"}


def test_complex_dtype_raises_ez1001() -> None:
    out = run_sim(
        """
        c = torch.randn(4, dtype=torch.complex64).npu()
        try:
            torch.exp(c)
        except RuntimeError as e:
            OUT["error"] = str(e)
        OUT["added"] = str((c + c).dtype)  # complex add has an aclnn kernel
        """
    )
    err = out["error"]
    assert err.startswith("NPU function error: call aclnnExp failed, error code is 161002\n[ERROR] ")
    assert re.search(SUFFIX.removeprefix(r"\n"), err)
    assert err.endswith(
        "AclNN_Parameter_Error(EZ1001): Tensor self not implemented for DT_COMPLEX64, should be in dtype support "
        "list [DT_FLOAT,DT_FLOAT16,DT_BFLOAT16,DT_INT8,DT_UINT8,DT_INT16,DT_INT32,DT_INT64,DT_BOOL,]."
    )
    assert out["added"] == "torch.complex64"


def test_matrix_dtype_list_is_enforced(tmp_path: Path) -> None:
    out = run_sim(
        """
        x = torch.ones(3, dtype=torch.int32).npu()
        try:
            x * x
        except RuntimeError as e:
            OUT["error"] = str(e)
        """,
        {"chip": "910b", "matrix_path": _tiny_matrix(tmp_path)},
    )
    assert "call aclnnMul failed" in out["error"]
    assert out["error"].endswith(
        "Tensor self not implemented for DT_INT32, should be in dtype support list [DT_FLOAT,DT_FLOAT16,DT_BFLOAT16,]."
    )


BF16_BODY = """
x = torch.ones(2, 3).npu()
for name, fn in [("cast", lambda: x.to(torch.bfloat16)),
                 ("add", lambda: torch.ones(2, dtype=torch.bfloat16).npu() + 1)]:
    try:
        OUT[name] = str(fn().dtype)
    except RuntimeError as e:
        OUT[name] = str(e)
OUT["bf16_supported"] = torch.npu.is_bf16_supported()
"""


def test_bf16_fails_on_310p() -> None:
    out = run_sim(BF16_BODY, {"chip": "310p"})
    assert out["cast"].startswith("NPU function error: call aclnnCast failed, error code is 161002")
    assert "Tensor out not implemented for DT_BFLOAT16" in out["cast"]
    assert out["add"].startswith("NPU function error: call aclnnAdd failed")
    assert "DT_BFLOAT16" not in out["add"].split("dtype support list")[1]
    assert out["bf16_supported"] is False


def test_bf16_works_on_910b() -> None:
    out = run_sim(BF16_BODY, {"chip": "910b"})
    assert out["cast"] == "torch.bfloat16" and out["add"] == "torch.bfloat16"
    assert out["bf16_supported"] is True


def test_host_syncs_counted_per_site() -> None:
    out = run_sim(
        """
        x = torch.arange(6.0).npu()
        begin_step("fwd")
        s = x.sum().item()
        h = x.cpu()
        l = x.tolist()
        end_step()
        OUT["values"] = [s, h.device.type, l]
        OUT["report"] = op_report()
        """
    )
    assert out["values"] == [15.0, "cpu", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]
    syncs = out["report"]["host_syncs"]
    assert syncs["total"] == 3
    assert len(syncs["sites"]) == 3 and all(s.startswith("<string>:") for s in syncs["sites"])
    (step,) = out["report"]["steps"]
    assert step["label"] == "fwd" and step["host_syncs"] == 3 and step["ops"] >= 3 and step["fallbacks"] == 0


def test_import_torch_npu_and_npu_api() -> None:
    out = run_sim(
        """
        import torch_npu
        from torch_npu.npu import amp
        torch_npu.npu.set_device(0)
        torch.npu.synchronize()
        torch.npu.empty_cache()
        x = torch.randn(256, 256, device="npu")
        OUT["api"] = [torch.npu.is_available(), torch.npu.device_count(), torch.npu.current_device(),
                      torch.npu.get_device_name(), torch_npu.npu is torch.npu, torch_npu.__version__]
        OUT["mem"] = torch.npu.memory_allocated() >= 256 * 256 * 4
        OUT["peak"] = torch.npu.max_memory_allocated() >= torch.npu.memory_allocated()
        with torch.npu.amp.autocast(dtype=torch.float16):
            OUT["amp"] = str(torch.nn.functional.linear(x, x).dtype)
        with torch.autocast(device_type="npu", dtype=torch.bfloat16):
            OUT["autocast"] = str((x @ x).dtype)
        OUT["devices"] = [str(torch.device("npu")), str(torch.device("npu:0")), str(x.device), x.is_npu]
        """
    )
    assert out["api"] == [True, 1, 0, "Ascend910B3", True, "2.13.0"]
    assert out["mem"] and out["peak"]
    assert out["amp"] == "torch.float16" and out["autocast"] == "torch.bfloat16"
    assert out["devices"] == ["npu", "npu:0", "npu:0", True]


def test_cuda_is_absent_as_on_an_ascend_host() -> None:
    out = run_sim(
        """
        OUT["available"] = torch.cuda.is_available()
        try:
            torch.ones(2).cuda()
        except AssertionError as e:
            OUT["error"] = f"{type(e).__name__}: {e}"
        """
    )
    assert out["available"] is False
    assert out["error"] == "AssertionError: Torch not compiled with CUDA enabled"


def test_device_mismatch_in_cat_raises() -> None:
    out = run_sim(
        """
        a = torch.ones(2, 3).npu()
        try:
            torch.cat([a, torch.ones(2, 3)])
        except RuntimeError as e:
            OUT["error"] = str(e)
        OUT["scalar_ok"] = (a * torch.tensor(2.0)).device.type  # 0-dim CPU tensors are allowed
        """
    )
    assert (
        out["error"]
        == "Expected all tensors to be on the same device, but found at least two devices, npu:0 and cpu!"
    )
    assert out["scalar_ok"] == "npu"


def test_module_to_npu_matches_cpu_exactly() -> None:
    out = run_sim(
        """
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv1d(3, 8, 3, padding=1), torch.nn.GELU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 10, 16), torch.nn.LayerNorm(16), torch.nn.Softmax(-1)).eval()
        x = torch.randn(2, 3, 10)
        with torch.no_grad():
            ref = m(x)
        m.to("npu")
        w = m[0].weight
        with torch.no_grad():
            y = m(x.to("npu"))
        OUT["param"] = [w.device.type, isinstance(w, torch.nn.Parameter)]
        OUT["out_device"] = str(y.device)
        OUT["equal"] = torch.equal(y.cpu(), ref)
        try:
            y.numpy()
        except TypeError as e:
            OUT["numpy"] = str(e)
        OUT["report"] = op_report()
        """
    )
    assert out["param"] == ["npu", True]
    assert out["out_device"] == "npu:0"
    assert out["equal"] is True
    assert out["numpy"] == (
        "can't convert npu:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
    )
    assert out["report"]["fallbacks"] == {}
    assert out["report"]["op_total"] > 5


def test_reset_and_reinstall_clear_counters() -> None:
    out = run_sim(
        """
        x = torch.randn(4).npu()
        torch.isneginf(x)
        reset()
        OUT["after_reset"] = [op_report()["op_total"], op_report()["fallbacks"]]
        install({"chip": "a3"})
        (x + 1).sum()
        rep = op_report()
        OUT["after_install"] = [rep["chip"], rep["op_total"], torch.npu.get_device_name()]
        """
    )
    assert out["after_reset"] == [0, {}]
    assert out["after_install"] == ["a3", 2, "Ascend910_9392"]


def test_inplace_views_and_out_resize_keep_npu_metadata() -> None:
    out = run_sim(
        """
        x = torch.zeros(2, 3).npu()
        v = x[:, 1]
        v.add_(5)
        r = torch.arange(5, device="npu")
        w = v.add_(1)
        OUT["vals"] = [x.cpu().tolist(), list(r.shape), r.cpu().tolist(), w is v, str(w.device)]
        out = torch.empty(0, device="npu")
        torch.add(torch.ones(3, device="npu"), 1, out=out)  # out= resizes the npu tensor
        OUT["out"] = [list(out.shape), out.cpu().tolist(), str(out.device)]
        """
    )
    assert out["vals"] == [[[0.0, 6.0, 0.0], [0.0, 6.0, 0.0]], [5], [0, 1, 2, 3, 4], True, "npu:0"]
    assert out["out"] == [[3], [2.0, 2.0, 2.0], "npu:0"]


def test_report_names_the_engine(sim_engine: str) -> None:
    out = run_sim("OUT['report'] = op_report()")
    assert out["report"]["engine"] == sim_engine
    assert out["report"]["engine_note"]


def test_views_share_storage_and_count_once() -> None:
    out = run_sim(
        """
        x = torch.zeros(4, 6).npu()
        reset()
        y = x.t()
        z = y[1:3]
        z.fill_(1.0)
        OUT["ops"] = op_report()["npu_ops"]
        OUT["same_memory"] = y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        OUT["x"] = x.cpu().sum(dim=0).tolist()
        OUT["devices"] = [str(y.device), str(z.device)]
        """
    )
    assert out["ops"] == {"aten::t": 1, "aten::slice.Tensor": 1, "aten::fill_.Scalar": 1}
    assert out["same_memory"] is True
    assert out["x"] == [0.0, 4.0, 4.0, 0.0, 0.0, 0.0]  # the writes through the view reached x
    assert out["devices"] == ["npu:0", "npu:0"]


def test_memory_allocated_follows_live_npu_tensors() -> None:
    out = run_sim(
        """
        import gc
        base = torch.npu.memory_allocated()
        t = torch.empty(1 << 18, device="npu")  # 1 MiB
        grown = torch.npu.memory_allocated() - base
        del t
        gc.collect()
        OUT["mem"] = [grown, torch.npu.memory_allocated() - base, torch.npu.max_memory_allocated() >= grown]
        """
    )
    assert out["mem"][0] >= 1 << 20
    assert out["mem"][1] == 0
    assert out["mem"][2] is True


FUSED_PARITY_BODY = """
from sandbox.ascend_sim import fused_ops as fo
from sandbox.ascend_sim.runtime import RT
import torch_npu
torch.manual_seed(0)
x, g = torch.randn(2, 5, 64), torch.randn(64)
q, c, s = torch.randn(1, 4, 7, 16), torch.randn(7, 16), torch.randn(7, 16)
k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)  # grouped key/value heads
pse = torch.randn(1, 4, 7, 9)
pse[..., 3, :] = float("-inf")  # one query row masked out entirely
same = lambda a, b: [torch.equal(p.cpu(), r) if isinstance(p, torch.Tensor) else p == r for p, r in zip(a, b)]
with torch.no_grad():
    OUT["rms"] = same(torch_npu.npu_rms_norm(x.npu(), g.npu(), 1e-5), fo.npu_rms_norm(x, g, 1e-5))
    OUT["rotary"] = same([torch_npu.npu_rotary_mul(q.npu(), c.npu(), s.npu())], [fo.npu_rotary_mul(q, c, s)])
    for name, kw in [("pse", {"pse": pse}), ("plain", {}), ("mask", {"atten_mask": torch.rand(7, 9) > 0.7})]:
        a = torch_npu.npu_fusion_attention(q.npu(), k.npu(), v.npu(), 4, "BNSD", scale=0.3,
                                           **{n: t.npu() for n, t in kw.items()})
        OUT[name] = same(a, fo.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.3, **kw))
        OUT[name + "_devices"] = sorted({str(p.device) for p in a if isinstance(p, torch.Tensor)})
    if RT.engine.name == "native":  # the C++ twins themselves, bit for bit
        mod = RT.engine.mod
        OUT["twin_rms"] = same(mod.rms_norm(x.npu(), g.npu(), 1e-5), fo.npu_rms_norm(x, g, 1e-5))
        OUT["twin_attn"] = same(mod.fusion_attention_bnsd(q.npu(), k.npu(), v.npu(), pse.npu(), 0.3),
                                fo.npu_fusion_attention(q, k, v, 4, "BNSD", pse=pse, scale=0.3)[:4])
        OUT["twin_cpu_arg"] = mod.rms_norm(x, g.npu(), 1e-5) is None  # not all on npu: the Python path
OUT["counts"] = op_report()["npu_ops"]
"""


def test_fused_ops_on_npu_match_the_references(sim_engine: str) -> None:
    out = run_sim(FUSED_PARITY_BODY)
    assert out["rms"] == [True, True] and out["rotary"] == [True]
    for name in ("pse", "plain", "mask"):
        assert out[name] == [True] * 7, name
        assert out[name + "_devices"] == ["npu:0"]
    assert out["counts"]["npu::npu_fusion_attention"] == 3
    assert out["counts"]["npu::npu_rms_norm"] == 1
    if sim_engine == "native":
        assert out["twin_rms"] == [True, True]
        assert out["twin_attn"] == [True] * 4
        assert out["twin_cpu_arg"] is True


def test_fused_op_errors_read_the_same_on_both_engines() -> None:
    out = run_sim(
        """
        import torch_npu
        with torch.no_grad():  # the native engine's C++ path is taken only without autograd
            try:
                torch_npu.npu_rms_norm(torch.randn(2, 8).npu(), torch.ones(4).npu())
            except RuntimeError as e:
                OUT["rms"] = str(e)
            try:
                torch_npu.npu_rotary_mul(torch.randn(8, 4).npu(), torch.ones(4).npu(), torch.ones(4).npu())
            except RuntimeError as e:
                OUT["rotary"] = str(e)
        """
    )
    assert out["rms"] == "gamma shape (4,) must match the trailing dims of self (2, 8)"
    assert out["rotary"] == "npu_rotary_mul: input must be 3-D or 4-D, got 2-D"


def test_device_queries_answer_as_torch_npu_and_the_rewrite_holds() -> None:
    """torch_npu's get_device_capability() is None (TORCH_NPU_DEVICE_CAPABILITY unset) and its properties
    leave CUDA's fields empty; the emulator answers the same, and the H1 rewrite of
    `torch.cuda.get_device_capability(0)[0]` still imports there (a plain rename is `None[0]`)."""
    out = run_sim(
        """
        from agents.rules.h1_cuda_device import device_agnostic
        OUT["raw"] = [torch.npu.get_device_capability(0), torch.npu.get_device_properties(0).major]
        src = "import torch\\nMAJOR = torch.cuda.get_device_capability(0)[0]\\n" \\
              "SMS = torch.cuda.get_device_properties(0).multi_processor_count\\n"
        ns = {}
        exec(device_agnostic(src).source, ns)
        OUT["port"] = [ns["MAJOR"], ns["SMS"] > 0]
        """
    )
    assert out["raw"] == [None, None]
    assert out["port"] == [0, True]


def test_autocast_casts_in_the_engine_and_leaves_out_variants_alone(sim_engine: str) -> None:
    """Under torch.autocast("npu") matmuls and convolutions run in the autocast dtype, the same on both
    engines; the native engine registers its autocast kernels in C++ (a Python kernel per matmul cost a
    small model's generate 2.4x its CPU time), and an out= call keeps the dtype of its out tensor."""
    out = run_sim(
        """
        lin = torch.nn.Linear(8, 8).npu()
        conv = torch.nn.Conv1d(2, 2, 3).npu()
        x = torch.randn(2, 8, device="npu")
        with torch.autocast(device_type="npu", dtype=torch.float16):
            OUT["linear"] = str(lin(x).dtype)
            OUT["conv"] = str(conv(torch.randn(1, 2, 8, device="npu")).dtype)
            OUT["add"] = str((x + x).dtype)
            buf = torch.empty(2, 2, device="npu")
            torch.mm(x[:, :2], x[:2, :2], out=buf)
            OUT["mm_out"] = str(buf.dtype)
            ref = torch.nn.functional.linear(x.cpu(), lin.weight.detach().cpu(), lin.bias.detach().cpu())
            OUT["close"] = bool(torch.allclose(lin(x).float().cpu(), ref, atol=1e-2))
        OUT["after"] = str(lin(x).dtype)
        OUT["mm_kernel"] = [ln for ln in torch._C._dispatch_dump("aten::mm").splitlines()
                            if ln.startswith("AutocastPrivateUse1")]
        OUT["autocast_ops"] = sorted(n.removeprefix("aten::") for n in
                                     torch._C._dispatch_get_registrations_for_dispatch_key("AutocastPrivateUse1"))
        """
    )
    # the C++ list and the Python one are one list: the same overloads get an autocast kernel on both engines
    import torch

    from sandbox.ascend_sim.device import _AUTOCAST_LOWER, AUTOCAST_OVERLOADS

    expected = sorted(n + ("" if ov == "default" else "." + ov) for n in _AUTOCAST_LOWER
                      for ov in getattr(torch.ops.aten, n).overloads() if ov in AUTOCAST_OVERLOADS)
    assert out["autocast_ops"] == expected
    assert (out["linear"], out["conv"], out["add"]) == ("torch.float16", "torch.float16", "torch.float32")
    assert out["mm_out"] == "torch.float32" and out["close"] and out["after"] == "torch.float32"
    where = out["mm_kernel"][0]
    assert ("ascend_sim_native.cpp" in where) if sim_engine == "native" else ("device.py" in where), where


def test_half_precision_matmuls_accumulate_in_float_like_the_cube_unit(sim_engine: str) -> None:
    """fp16/bf16 matmuls of a prefill's many rows compute in float and round once (the Cube unit's fp32
    accumulation; the CPU's half kernels cost 3-5x the float time there); a decode row keeps the CPU's half
    kernel. Both engines give the same bits, and the ops are counted as before."""
    out = run_sim(
        """
        torch.manual_seed(0)
        res = {}
        for dt in (torch.float16, torch.bfloat16):
            w = torch.randn(256, 512).to(dt)
            b = torch.randn(256).to(dt)
            for rows in (64, 1):
                x = torch.randn(rows, 512).to(dt)
                lin = torch.nn.functional.linear(x.npu(), w.npu(), b.npu()).cpu()
                mm = torch.mm(x.npu(), w.t().npu()).cpu()
                bm = torch.bmm(x.npu()[None].expand(2, -1, -1), w.t().npu()[None].expand(2, -1, -1)).cpu()
                via_float = torch.addmm(b.float(), x.float(), w.t().float()).to(dt)
                mm_float = torch.mm(x.float(), w.t().float()).to(dt)
                key = f"{str(dt).removeprefix('torch.')}-{rows}"
                res[key] = {
                    "dtype": str(lin.dtype), "linear_float": torch.equal(lin, via_float),
                    "mm_float": torch.equal(mm, mm_float), "bmm_float": torch.equal(bm[1], mm_float),
                    "linear_cpu_half": torch.equal(lin, torch.nn.functional.linear(x, w, b)),
                    "mm_cpu_half": torch.equal(mm, torch.mm(x, w.t())),
                }
        OUT["res"] = res
        OUT["counted"] = {k.removeprefix("aten::"): v for k, v in op_report()["npu_ops"].items()
                          if k in ("aten::mm", "aten::addmm", "aten::bmm")}
        """
    )
    for dt in ("float16", "bfloat16"):
        prefill, decode = out["res"][f"{dt}-64"], out["res"][f"{dt}-1"]
        assert prefill["dtype"] == f"torch.{dt}"
        assert prefill["linear_float"] and prefill["mm_float"] and prefill["bmm_float"], prefill
        assert decode["linear_cpu_half"] and decode["mm_cpu_half"], decode
    # the CPU's half kernel gives other bits on a prefill: the float path is what ran
    assert not all(out["res"][f"{dt}-64"]["mm_cpu_half"] for dt in ("float16", "bfloat16"))
    assert all(out["counted"].get(op, 0) >= 4 for op in ("mm", "addmm", "bmm")), out["counted"]
