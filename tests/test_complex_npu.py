"""Complex tensors on the NPU path (hazard H27, agents/rules/h27_complex.py): the scan, the rewrites into real
arithmetic and the CPU island, each checked by running the original and the rewritten code and comparing the
numbers; the island on ascend-sim, where the original fails with the NPU's DT_COMPLEX64 message; the debugger's
diagnosis of that message; and two toy releases (tests/complex_models.py) ported end to end."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from agents.models import Frame, StructuredException
from agents.policies.rule import RulePolicy
from agents.reading.scanner import scan_source
from agents.rules.h27_complex import complex_cpu_island, complex_to_real, fft_verdict
from sandbox.targets import Target
from tests.complex_models import HYENA, ROTARY, write_complex_rotary_lm, write_hyena_fft_lm

REPO = Path(__file__).resolve().parents[1]


def _module(source: str, name: str) -> types.ModuleType:
    """Execute a model source (its relative config import dropped) as a module."""
    mod = types.ModuleType(name)
    code = source.replace("from .configuration_toy import ToyConfig\n", "ToyConfig = None\n")
    exec(compile(code, f"<{name}>", "exec"), mod.__dict__)  # noqa: S102 - the test's own toy source
    return mod


def _matrix(tmp_path: Path, fft_dtypes: list[str] | None) -> Target:
    """A target whose op matrix has the FFT kernels, with ``fft_dtypes`` listed for them (None: no list)."""
    ops = {op: {"npu": True, "via": ["wheel"], "kernel": "op_api", "exec": None, "dtypes": fft_dtypes}
           for op in ("_fft_r2c", "_fft_c2r", "_fft_c2c")}
    path = tmp_path / f"torch_npu-9.9.9-{'-'.join(fft_dtypes or ['none'])}.json"
    path.write_text(json.dumps({"schema": 1, "torch_npu_version": "9.9.9", "torch_version": "2.13", "sources": [],
                                "ops": ops, "fallback_ops": [], "custom_ops": []}))
    return Target("ascend-sim", "npu", options={"matrix_path": str(path)})


# --- the scan ----------------------------------------------------------------------------------------------

def test_the_scan_finds_complex_sites_and_says_which_the_rewrite_reaches() -> None:
    found = {(f.line, f.fixable) for f in scan_source(ROTARY, "modeling_toy.py") if f.hazard == "H27"}
    lines = ROTARY.splitlines()

    def line_of(text: str) -> int:
        return next(i + 1 for i, ln in enumerate(lines) if text in ln)

    assert (line_of("torch.polar(torch.ones_like(freqs), freqs)"), True) in found
    assert (line_of("xq_out = torch.view_as_real(xq_ * freqs_cis)"), True) in found
    assert (line_of("xq_ = torch.view_as_complex("), False) in found  # a view: reported, not rewritten
    assert not any(f.hazard == "H5" and f.rule == "complex-dtype" for f in scan_source(ROTARY, "m.py"))


def test_the_op_matrix_decides_whether_an_fft_path_stays_on_the_npu(tmp_path: Path) -> None:
    no_list = _matrix(tmp_path, None)
    on_npu, why = fft_verdict(["rfft", "irfft"], no_list)
    assert not on_npu and "_fft_c2r" in why and "9.9.9" in why and "lists no complex input dtype" in why
    assert fft_verdict(["rfft"], no_list)[0]  # r2c takes a real input
    listed = _matrix(tmp_path, ["float32", "complex64"])
    assert fft_verdict(["rfft", "irfft"], listed)[0]
    kept = complex_cpu_island(HYENA, target=listed)
    assert not kept.changed and any("kept on the NPU" in s for s in kept.skipped)
    islanded = complex_cpu_island(HYENA, target=no_list)
    assert islanded.changed and "@_npuport_cpu_island(" in islanded.source
    assert any("`fftconv` runs as a CPU island" in e for e in islanded.edits)
    # a method that reads its module's weights through self is not made an island
    assert any("reads its module's own state" in s for s in complex_cpu_island(
        "import torch\nclass M:\n    def f(self, x):\n        return torch.fft.irfft(torch.fft.rfft(x * self.w))\n",
        target=no_list).skipped)
    assert not complex_to_real(ROTARY, target=Target("cpu", "cpu")).changed


# --- meaning: the original's numbers ------------------------------------------------------------------------

@pytest.mark.meaning("complex-to-real")
def test_complex_rotary_rewritten_into_real_pairs_gives_the_same_rotations() -> None:
    import torch

    out = complex_to_real(ROTARY)
    assert out.changed and "_npuport_unit_phase(freqs)" in out.source
    assert "_npuport_mul_as_real(xq_, freqs_cis)" in out.source
    old, new = _module(ROTARY, "rope_old"), _module(out.source, "rope_new")
    table_old, table_new = old.precompute_freqs_cis(16, 32), new.precompute_freqs_cis(16, 32)
    assert table_new.dtype == torch.complex64 and table_new.shape == table_old.shape
    assert not table_new.as_subclass(torch.Tensor).is_complex()  # stored as the real angle
    g = torch.Generator().manual_seed(0)
    xq, xk = torch.randn(2, 5, 3, 16, generator=g), torch.randn(2, 5, 3, 16, generator=g)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    q0, k0 = old.apply_rotary_emb(xq, xk, table_old[pos])
    q1, k1 = new.apply_rotary_emb(xq, xk, table_new[pos])
    torch.testing.assert_close(q1, q0, rtol=0, atol=1e-6)
    torch.testing.assert_close(k1, k0, rtol=0, atol=1e-6)


@pytest.mark.meaning("complex-to-real")
def test_a_unit_phase_table_means_its_complex_value_under_every_op() -> None:
    import torch

    new = _module(complex_to_real(ROTARY).source, "rope_ops")
    angle = torch.linspace(-3, 3, 24).reshape(6, 4)
    table, ref = new._npuport_unit_phase(angle), torch.polar(torch.ones_like(angle), angle)
    assert table.is_complex() and not table.is_floating_point() and table.dtype == torch.complex64
    # views, indexing, moves and concatenation act on the angle and stay a table
    for view, want in ((table[2:4], ref[2:4]), (table[torch.tensor([5, 0])], ref[torch.tensor([5, 0])]),
                       (table.view(2, 3, 4), ref.view(2, 3, 4)), (table.to("cpu"), ref),
                       (torch.cat([table[:1], table[3:]]), torch.cat([ref[:1], ref[3:]]))):
        assert type(view).__name__ == "_NpuportUnitPhase"
        torch.testing.assert_close(view * 1, want)  # any other op sees the complex value
    torch.testing.assert_close(table.real, ref.real)
    torch.testing.assert_close(torch.view_as_real(table), torch.view_as_real(ref))
    torch.testing.assert_close(table.abs(), ref.abs())
    with pytest.warns(UserWarning):  # as the original: a real dtype keeps the real part and says so
        torch.testing.assert_close(table.to(torch.float32), ref.real)
    module = torch.nn.Module()
    module.register_buffer("freqs_cis", table, persistent=True)
    module.to("cpu")
    module.half()  # complex buffers are not floating point: .half() leaves them, as it leaves the original
    assert type(module.freqs_cis).__name__ == "_NpuportUnitPhase" and module.freqs_cis.dtype == torch.complex64
    assert module.state_dict()["freqs_cis"].is_complex()  # saved as the complex value it means
    torch.testing.assert_close(copy.deepcopy(module).freqs_cis * 1, ref)
    with pytest.raises(RuntimeError, match="cannot be written in place"):
        table.mul_(2)


@pytest.mark.meaning("complex-to-real")
def test_a_product_with_a_real_or_complex_operand_reads_as_the_original_pairs() -> None:
    import torch

    src = ("import torch\ndef f(a, b):\n    return torch.view_as_real(a * b)\n"
           "def g(a, b):\n    return torch.view_as_real(torch.mul(a, b))\n")
    out = complex_to_real(src)
    assert out.source.count("_npuport_mul_as_real(") == 3  # two sites and the helper
    old, new = _module(src, "prod_old"), _module(out.source, "prod_new")
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 4, dtype=torch.complex64, generator=g)
    b = torch.randn(3, 4, dtype=torch.complex64, generator=g)
    r = torch.randn(3, 4, generator=g)
    for x, y in ((a, b), (a, r), (r, b)):
        for fn in ("f", "g"):
            torch.testing.assert_close(getattr(new, fn)(x, y), getattr(old, fn)(x, y), rtol=0, atol=1e-6)


@pytest.mark.meaning("complex-cpu-island")
def test_an_fft_island_computes_what_the_original_does(tmp_path: Path) -> None:
    import torch

    out = complex_cpu_island(HYENA, target=_matrix(tmp_path, None))
    old, new = _module(HYENA, "hy_old"), _module(out.source, "hy_new")
    assert new.fftconv.npuport_cpu_island.startswith("torch.fft.irfft needs _fft_c2r")
    g = torch.Generator().manual_seed(2)
    u, k, d = torch.randn(1, 8, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    torch.testing.assert_close(new.fftconv(u, k, d), old.fftconv(u, k, d), rtol=0, atol=0)


SIM_ISLAND = """
import json, sys, types
sys.path.insert(0, {repo!r})
from sandbox.ascend_sim import install, op_report
install({{"chip": "910b"}})
import torch
src = json.loads({src!r})
out = {{}}
for name, code in src.items():
    mod = types.ModuleType(name)
    exec(compile(code.replace("from .configuration_toy import ToyConfig", "ToyConfig = None"), name + ".py", "exec"),
         mod.__dict__)
    g = torch.Generator().manual_seed(2)
    u, k, d = torch.randn(1, 8, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    before = op_report()["host_syncs"]["total"]
    try:
        y = mod.fftconv(u.npu(), k.npu(), d.npu())
        out[name] = {{"device": str(y.device), "values": y.cpu().tolist(), "cpu": mod.fftconv(u, k, d).tolist(),
                     "syncs": op_report()["host_syncs"]["total"] - before}}
    except RuntimeError as e:
        out[name] = {{"error": str(e).splitlines()[-1]}}
print("@@" + json.dumps(out))
"""


@pytest.mark.meaning("complex-cpu-island")
def test_on_ascend_sim_the_original_fails_on_complex64_and_the_island_runs_with_its_host_sync(tmp_path: Path) -> None:
    islanded = complex_cpu_island(HYENA, target=_matrix(tmp_path, None)).source
    code = SIM_ISLAND.format(repo=str(REPO), src=json.dumps({"original": HYENA, "island": islanded}))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    assert line, proc.stdout + proc.stderr
    out = json.loads(line[2:])
    assert "not implemented for DT_COMPLEX64" in out["original"]["error"]
    island = out["island"]
    assert island["device"].startswith("npu") and island["syncs"] >= 1
    assert island["values"] == island["cpu"]


# --- the debugger --------------------------------------------------------------------------------------------

def test_the_npus_complex64_message_is_diagnosed_and_fixed_at_the_failing_line() -> None:
    line = next(i + 1 for i, ln in enumerate(HYENA.splitlines()) if "/ fft_size" in ln)
    exc = StructuredException(
        type="RuntimeError", frames=[Frame(file="modeling_toy.py", line=line, func="fftconv", in_model=True)],
        message="NPU function error: call aclnnDiv failed, error code is 161002\n[ERROR] ...\n"
                "AclNN_Parameter_Error(EZ1001): Tensor self not implemented for DT_COMPLEX64, should be in dtype "
                "support list [DT_FLOAT,DT_FLOAT16,].")
    diag = RulePolicy().diagnose("run-1", exc, [])
    assert (diag.kind, diag.fix, diag.file, diag.params["line"]) == ("npu-complex", "complex-to-real",
                                                                      "modeling_toy.py", line)
    assert "aclnnDiv rejects DT_COMPLEX64" in diag.summary
    fixed = complex_to_real(HYENA, **diag.params)
    assert any("`fftconv` runs as a CPU island: aclnnDiv rejects DT_COMPLEX64" in e for e in fixed.edits)
    # a float64 rejection is still H5's
    exc64 = exc.model_copy(update={"message": "EZ1001: Tensor self not implemented for DT_DOUBLE"})
    assert RulePolicy().diagnose("run-1", exc64, []).fix == "float64-to-float32"


# --- two toy releases, ported as a user would ----------------------------------------------------------------

def _port(model: Path, out: Path, home: Path) -> dict[str, Any]:
    env = dict(os.environ, NPUPORT_HOME=str(home), NPUPORT_SERVE="0", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "api.cli", "port", str(model), "--target", "ascend-sim", "--out",
                           str(out)], capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert (out / "report.json").is_file(), proc.stdout + proc.stderr
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_a_complex_rotary_release_validates_on_ascend_sim(tmp_path: Path, sim_home: Path) -> None:
    report = _port(write_complex_rotary_lm(tmp_path / "rope"), tmp_path / "out", sim_home)
    assert report["numerics"]["verdict"] == "match", report["reason"]
    assert "complex-to-real" in {p["codemod"] for p in report["patches"]}
    assert report["counters"]["port_runs"] == 1  # fixed before the first run


@pytest.mark.slow
def test_a_hyena_fft_release_validates_on_ascend_sim_with_an_explained_island(tmp_path: Path, sim_home: Path) -> None:
    report = _port(write_hyena_fft_lm(tmp_path / "hyena"), tmp_path / "out", sim_home)
    assert report["numerics"]["verdict"] == "match", report["reason"]
    island = [p for p in report["patches"] if p["codemod"] == "complex-cpu-island"]
    assert island and any("CPU island" in e and "_fft_c2r" in e for e in island[0]["edits"])
    port_run = [r for r in report["runs"] if r["purpose"] == "port"][-1]
    sites = port_run["op_stats"]["host_syncs"]["sites"]
    # the island's host sync, counted in the port's own files: the helper module beside the model file, where
    # the island's helper lives (agents/fixing/helper_module.py)
    assert any("_npuport_helpers.py" in s for s in sites), sites
    md = (tmp_path / "out" / "report.md").read_text()
    assert "CPU island" in md
