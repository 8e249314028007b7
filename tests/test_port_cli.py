"""`npuport port` end to end through the real graph and real subprocess sandboxes, and every bad
input of the walking-skeleton issue: each ends with a one-line error, a report, and an untouched
original tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.workspace import tree_digest
from tests.conftest import EXAMPLES, REPO_ROOT
from tests.tiny_models import write_tiny_model

NPUPORT = [sys.executable, "-m", "api.cli"]


def npuport(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NPUPORT_HOME=str(home), COLUMNS="200")
    return subprocess.run([*NPUPORT, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO_ROOT)


def _report(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_port_ocr_mini_on_cpu_end_to_end(tmp_path: Path, npuport_home: Path) -> None:
    model = EXAMPLES / "ocr_mini"
    before = tree_digest(model)
    out = tmp_path / "bundle"
    r = npuport("port", str(model), "--target", "cpu", "--out", str(out), home=npuport_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree_digest(model) == before, "the original tree was modified"
    report = _report(out)
    assert report["status"] == "validated"
    assert report["numerics"]["verdict"] == "match"
    hazards = {f["hazard"] for f in report["findings"]}
    assert {"H1", "H2", "H3", "H5", "H6"} <= hazards
    codemods = [p["codemod"] for p in report["patches"]]
    # imports first, then the CUDA-only attention call (H16), autocast and the device
    assert codemods[:4] == ["guard-cuda-only-imports", "attention-to-sdpa", "cuda-autocast", "device-agnostic"]
    patch = (out / "port.patch").read_text()
    assert "-from flash_attn import" in patch and "_npuport_device()" in patch
    assert (out / "patched" / "modeling_ocr_mini.py").exists()
    assert "validated" in r.stdout
    # Sandbox runs of the port: 1 + failures that no recipe predicted (none here).
    assert report["counters"]["port_runs"] == 1
    trace = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    agents = [t["agent"] for t in trace]
    order = [a for i, a in enumerate(agents) if i == 0 or agents[i - 1] != a]
    assert order[:6] == ["planner", "environment", "code_reader", "patcher", "executor", "validator"]


def test_missing_path_is_a_one_line_error(tmp_path: Path, npuport_home: Path) -> None:
    r = npuport("port", str(tmp_path / "nope"), "--target", "cpu", home=npuport_home)
    assert r.returncode == 2
    assert "does not exist" in r.stderr and "Traceback" not in r.stderr + r.stdout


def test_folder_without_python(tmp_path: Path, npuport_home: Path) -> None:
    model = tmp_path / "empty_model"
    model.mkdir()
    (model / "README.md").write_text("no code here\n")
    out = tmp_path / "out"
    r = npuport("port", str(model), "--target", "cpu", "--out", str(out), home=npuport_home)
    assert r.returncode == 2 and "no Python files" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not out.exists()  # refused before the graph starts: no bundle


def test_syntax_error_in_model(tmp_path: Path, npuport_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    (model / "broken.py").write_text("def f(:\n    pass\n")
    before = tree_digest(model)
    out = tmp_path / "out"
    r = npuport("port", str(model), "--target", "cpu", "--out", str(out), home=npuport_home)
    # bad input (issue 27): refused before anything runs, exit 2 with file:line, no bundle written
    assert r.returncode == 2 and "broken.py:1" in r.stderr and "SyntaxError" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert tree_digest(model) == before
    assert not out.exists()


@pytest.mark.slow
def test_model_that_crashes_for_reasons_unrelated_to_devices(tmp_path: Path, npuport_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m", twist="scale = 1 / 0")
    before = tree_digest(model)
    out = tmp_path / "out"
    r = npuport("port", str(model), "--target", "cpu", "--out", str(out), home=npuport_home)
    assert r.returncode == 1
    assert "could not port because" in r.stderr and "ZeroDivisionError" in r.stderr
    assert "Traceback" not in r.stderr
    report = _report(out)
    assert report["status"] == "failed" and report["diagnoses"][-1]["kind"] == "exception"
    assert report["counters"]["port_runs"] == 1  # no recipe applies, so no blind retries
    assert tree_digest(model) == before


@pytest.mark.slow
def test_entry_that_hangs_is_killed_by_the_timeout(tmp_path: Path, npuport_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m", twist="import time; time.sleep(600)")
    out = tmp_path / "out"
    r = npuport("port", str(model), "--target", "cpu", "--out", str(out), "--run-timeout", "5", home=npuport_home,
                timeout=120)
    assert r.returncode == 1
    assert "wall-clock limit" in r.stderr and "Traceback" not in r.stderr
    assert _report(out)["runs"][0]["status"] == "timeout"


def _make_read_only(folder: Path) -> bool:
    """chmod is not enough for root (CI runs as root): use the immutable attribute where possible."""
    if os.geteuid() != 0:
        folder.chmod(0o500)
        return True
    return subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0


def _undo_read_only(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    folder.chmod(0o700)


@pytest.mark.slow
def test_read_only_output_folder(tmp_path: Path, npuport_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    out = tmp_path / "ro"
    out.mkdir()
    if not _make_read_only(out):
        pytest.skip("this filesystem cannot make a folder read-only for root (chattr +i failed)")
    try:
        r = npuport("port", str(model), "--target", "cpu", "--out", str(out / "bundle"), home=npuport_home)
    finally:
        _undo_read_only(out)
    assert r.returncode == 1 and "cannot write the bundle" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    fallback = next(npuport_home.glob("workspaces/*/bundle/report.json"))
    assert json.loads(fallback.read_text())["status"] == "failed"


@pytest.mark.slow
def test_full_output_folder(tmp_path: Path, npuport_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/full answers every write with ENOSPC, like a full disk: the bundle goes beside the workspace."""
    model = write_tiny_model(tmp_path / "m")
    out = tmp_path / "bundle"
    from knowledge.bundles import mark_bundle

    mark_bundle(out)  # a folder marked for npuport (no owner yet): the reporter may write into it
    (out / "report.json").symlink_to("/dev/full")
    # `npuport port` refuses a non-empty --out (and --force would remove the link), so the reporter's
    # fallback is driven through the CLI's runner directly
    from api.cli import run_port_cli

    code = run_port_cli({"model_path": str(model), "target": "cpu", "out_dir": str(out)})
    captured = capsys.readouterr()
    assert code == 1
    assert "cannot write the bundle" in captured.err and "No space left" in captured.err, captured.err
    assert "Traceback" not in captured.err
    fallback = next(npuport_home.glob("workspaces/*/bundle/report.json"))
    assert json.loads(fallback.read_text())["status"] == "failed"


@pytest.mark.slow
def test_port_ocr_mini_on_ascend_sim_via_auto(tmp_path: Path, sim_home: Path) -> None:
    """No NPU here, so `auto` picks the emulator and says why; the port validates with no CPU fallbacks."""
    model = EXAMPLES / "ocr_mini"
    before = tree_digest(model)
    out = tmp_path / "bundle"
    r = npuport("port", str(model), "--target", "auto", "--out", str(out), home=sim_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("auto: torch_npu cannot be imported here" in r.stdout
            or "auto: torch_npu imports but sees no NPU" in r.stdout)
    report = _report(out)
    assert report["target"]["name"] == "ascend-sim" and report["numerics"]["verdict"] == "match"
    port_run = [x for x in report["runs"] if x["purpose"] == "port"][-1]
    assert port_run["op_stats"]["target"] == "ascend-sim"
    assert port_run["op_stats"]["matrix"].endswith("torch_npu-2.13.0.json")
    assert port_run["op_stats"]["fallbacks"] == {}
    # The performance rewrites leave no host sync inside a decode step (the manifest's step).
    steps = port_run["op_stats"]["steps"]
    assert len(steps) == 8 and [s["host_syncs"] for s in steps] == [0] * 8, steps
    assert {"moe-dense-dispatch", "vectorise-mask-loops"} <= {p["codemod"] for p in report["patches"]}
    assert tree_digest(model) == before


@pytest.mark.slow
def test_port_tiny_llm_on_ascend_sim_with_its_own_environment(tmp_path: Path, sim_home: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The second example pins transformers 4.34 (a private helper it imports is gone from 5.x): it runs in
    a layered environment, gets hccl instead of nccl, and validates on the emulator."""
    monkeypatch.setenv("NPUPORT_ENV_CACHE", os.environ.get("NPUPORT_ENV_CACHE",
                                                           str(Path.home() / ".cache" / "npuport-tests" / "envs")))
    out = tmp_path / "bundle"
    r = npuport("port", str(EXAMPLES / "tiny_llm"), "--target", "ascend-sim", "--out", str(out), home=sim_home,
                timeout=900)
    if r.returncode != 0 and "cannot build the model's environment" in r.stderr:
        pytest.skip(f"the package registry cannot be reached: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout + r.stderr
    report = _report(out)
    assert report["numerics"]["verdict"] == "match"
    codemods = {p["codemod"] for p in report["patches"]}
    assert {"device-agnostic", "float64-to-float32", "nccl-to-hccl"} <= codemods
    patch = (out / "port.patch").read_text()
    assert '"nccl"' not in patch.split("+++")[-1] or "_npuport_dist_backend()" in patch
