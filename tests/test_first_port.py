"""A first port as a user runs it (issue 41): the bundle comes first and the deployment check after it, as a
phase of its own (resumable, `npuport deploy BUNDLE`); a slow host's timeouts are said as timeouts; speed
verdicts hold only beyond the runs' spread; a model that fails by itself is said to; npuport's helpers live in
a module of their own; piped output is whole.

The package index the vLLM environment is built from is outside our walls: where a test needs the deployment
to end quickly, the environment build fails as an unreachable index would. Everything else is real: the graph,
the workspace, the sandbox runs of a tiny model on the CPU target."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from api.cli import app
from knowledge.errors import EnvBuildError
from knowledge.interrupt import PortInterrupted
from tests.tiny_models import write_tiny_model


def _no_index(*_a: Any, **_k: Any) -> Any:
    raise EnvBuildError("the package index is unreachable")


def _port(tmp_path: Path, *extra: str, twist: str = "pass") -> tuple[Any, Path]:
    model = write_tiny_model(tmp_path / "m", twist=twist)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["port", str(model), "--target", "cpu", "--out", str(out), "--max-runs", "3", *extra])
    return r, out


# -- bundle first, deployment after --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_bundle_is_written_before_the_deployment_and_stands_when_it_fails(
        tmp_path: Path, npuport_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def env_then_fail(*_a: Any, **_k: Any) -> Any:
        seen["report_before"] = json.loads((tmp_path / "out" / "report.json").read_text())
        raise EnvBuildError("the package index is unreachable")

    monkeypatch.setattr("agents.deploy.serving.ensure_vllm_env", env_then_fail)
    r, out = _port(tmp_path, "--serve")
    assert r.exit_code == 0, r.output  # the port validated; its deployment failing is reported, not a failed port
    before = seen["report_before"]  # the bundle was complete before the deployment started
    assert before["status"] == "validated" and before["deployment"]["status"] == "pending"
    deployed = json.loads((out / "deployment.json").read_text())
    assert deployed["status"] == "failed" and "index is unreachable" in deployed["error"]
    report = json.loads((out / "report.json").read_text())
    assert report["deployment"]["status"] == "failed"
    md = (out / "report.md").read_text()
    summary = md.split("\n## ", 1)[0]
    assert "- **Deployment:** failed" in summary, summary  # in the summary, not only in its section
    assert "deployer" in r.output and "deployment: the vLLM environment" in r.output  # a named phase, as lines
    assert "deployment" in r.output.split("validation", 1)[1]  # the closing summary names it


@pytest.mark.slow
def test_an_interrupted_deployment_leaves_the_bundle_and_npuport_deploy_runs_it(
        tmp_path: Path, npuport_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_a: Any, **_k: Any) -> Any:
        raise PortInterrupted("interrupted by the user")  # Ctrl-C while the vLLM env builds

    monkeypatch.setattr("agents.deploy.serving.ensure_vllm_env", interrupted)
    r, out = _port(tmp_path, "--serve")
    assert r.exit_code == 130, r.output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "validated" and report["deployment"]["status"] == "pending"
    md = (out / "report.md").read_text()
    assert "Deployment: NOT RUN YET" in md and "npuport deploy" in md
    assert not (out / "deployment.json").exists()

    monkeypatch.setattr("agents.deploy.serving.ensure_vllm_env", _no_index)
    d = CliRunner().invoke(app, ["deploy", str(out)])
    assert d.exit_code == 1, d.output  # not served: said, and the bundle now records it
    assert "deployment: the vLLM environment" in d.output and "index is unreachable" in d.output
    assert json.loads((out / "deployment.json").read_text())["status"] == "failed"
    assert "NOT RUN YET" not in (out / "report.md").read_text()


def test_deploy_refuses_a_folder_that_is_not_a_validated_bundle(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["deploy", str(tmp_path)])
    assert r.exit_code == 2 and "not a bundle" in r.output
    (tmp_path / "report.json").write_text(json.dumps({"status": "failed"}))
    r = CliRunner().invoke(app, ["bench", str(tmp_path)])
    assert r.exit_code == 2 and "did not validate" in r.output


# -- the budget ------------------------------------------------------------------------------------------


def test_the_port_s_check_is_a_budgeted_probe_and_the_report_says_what_it_cut() -> None:
    from agents.deploy.check_plan import FULL, PROBE
    from agents.deploy.serve_report import deployment_lines

    assert PROBE.after_start_s <= 180 and not PROBE.batched and max(PROBE.concurrencies) < max(FULL.concurrencies)
    assert FULL.batched and FULL.cut() == ""
    rec = {"status": "failed", "error": "serve.sh did not start: x", "start_s": 40.0,
           "budget": {"plan": "probe", "start_timeout_s": 900.0, "after_start_s": 180.0, "cut": PROBE.cut(),
                      "timed_out": "the server's start and check (1080 s)"}}
    text = "\n".join(deployment_lines(rec))
    assert "cut by the budget" in text and "npuport bench BUNDLE" in text and "Transformers batched" in text
    assert "ran past its limit" in text


def test_no_vllm_path_is_not_said_twice_and_a_head_size_note_only_for_a_served_model() -> None:
    from agents.deploy.serve_report import deployment_lines

    rec = {"status": "no vLLM path", "error": "no vLLM path: vLLM has no class for X",
           "config_note": "head_dim 16 is not a head size vLLM's CPU attention implements"}
    text = "\n".join(deployment_lines(rec))
    assert "No vLLM path: no vLLM path" not in text and "No vLLM path: vLLM has no class for X" in text
    assert "head_dim 16" not in text


def test_the_client_leaves_out_a_concurrency_past_the_check_s_budget(tmp_path: Path) -> None:
    from sandbox.serving import client

    served: list[int] = []
    orig = client._bench

    def slow_bench(base: str, model: str, requests: list[dict[str, Any]], c: int, image: Any = None) -> dict[str, Any]:
        served.append(c)
        time.sleep(0.3)
        return {"concurrency": c}

    client._bench = slow_bench  # type: ignore[assignment]
    client._completion = lambda *a, **k: {"tokens": [1]}  # type: ignore[assignment]
    try:
        out: dict[str, Any] = {"start_s": 1.0}
        spec = {"model_name": "m", "prompts": [[1]], "max_new_tokens": 1, "requests": [], "concurrencies": [1, 8, 32],
                "after_start_s": 0.1, "progress_path": str(tmp_path / "p")}
        client._check(spec, "http://127.0.0.1:1", out)
    finally:
        client._bench = orig  # type: ignore[assignment]
        import importlib

        importlib.reload(client)
    assert served == [1] and "concurrency 8 and above not measured" in out["cut"]
    assert "throughput" in (tmp_path / "p").read_text().splitlines()[-1]


# -- progress ------------------------------------------------------------------------------------------


def test_a_pipe_gets_a_line_at_least_every_heartbeat(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from api import cli_port
    from api.cli_live import LiveStatus

    monkeypatch.setattr(cli_port, "HEARTBEAT_S", 0.3)
    status = LiveStatus(8, None)
    status.on_event("task", {"node": "deployer"})
    status.on_event("phase", {"text": "deployment: starting vLLM"})
    with cli_port.Heartbeat(status):
        time.sleep(1.0)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "deployer" in ln]
    assert len(lines) >= 2 and all("starting vLLM" in ln for ln in lines), lines


def test_a_sandboxed_side_s_progress_reaches_the_phase_callback(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.deploy import sandboxed

    monkeypatch.setattr(sandboxed, "HEARTBEAT_S", 0.5)
    got: list[str] = []
    progress = tmp_path / "x.progress"
    with sandboxed._watching(progress, got.append):
        progress.write_text("deployment: tokens through the server\n")
        time.sleep(2.8)
    assert got[0] == "deployment: tokens through the server"
    assert len(got) >= 2 and got[1].startswith("deployment: tokens through the server (")  # the running step again


def test_a_side_stopped_for_time_is_said_by_the_step_it_was_in_not_by_a_library_warning(tmp_path: Path) -> None:
    """DeepSeek-OCR-2's reference was reported as "stopped: The attention mask and the pad token id were not
    set" (the last stderr line, a transformers warning); the step it was in comes first now."""
    from agents.deploy.sandboxed import last_step, no_result

    progress = tmp_path / "serve_ref.progress"
    assert last_step(progress) == ""  # no progress file: no step
    progress.write_text("deployment: Transformers' reference tokens\ndeployment: Transformers' throughput\n")
    step = last_step(progress)
    assert step == "deployment: Transformers' throughput"
    out = no_result("sandbox.serving.reference", "timeout", None, 600.0, step, "The attention mask was not set.")
    assert out["timed_out"] and out["error"].startswith(
        "sandbox.serving.reference ran past its time limit (600 s) and was stopped in its step "
        "\"deployment: Transformers' throughput\"; its last output: The attention mask"), out
    crashed = no_result("sandbox.serving.reference", "error", 1, 600.0, step, "Traceback ...")
    assert "timed_out" not in crashed and "ended (error, code 1) without a result: Traceback" in crashed["error"]
    (tmp_path / "elsewhere").write_text("secret step\n")
    link = tmp_path / "link.progress"
    link.symlink_to(tmp_path / "elsewhere")
    assert last_step(link) == ""  # written by sandboxed code: never read through a link


# -- limits that scale, timeouts said as such ----------------------------------------------------------


def test_a_reference_s_limit_scales_with_the_port_s_measured_run() -> None:
    from agents.models import RunRecord
    from agents.runs import scaled_limits

    def run(ok: bool, wall_s: float) -> RunRecord:
        return RunRecord(id="run-1", purpose="port", target="cpu", ok=ok, status="ok" if ok else "timeout",
                         wall_s=wall_s, result_path="")

    req = {"model_path": "m", "run_timeout_s": 300}
    assert scaled_limits(req, []).wall_s == 300
    assert scaled_limits(req, [run(True, 299.7)]).wall_s > 3 * 299
    assert scaled_limits(req, [run(False, 300)]).wall_s == 300  # a failed run: no


def test_a_timed_out_reference_is_a_timeout_not_a_porting_or_cuda_failure() -> None:
    from agents.models import RunRecord
    from agents.report.bundle import NOT_PORTED, TIMED_OUT, outcome_label
    from agents.report.markdown import render_markdown
    from agents.validation.compare import timeout_detail

    runs = [{"id": "run-1", "purpose": "port", "target": "ascend-sim", "ok": True, "status": "ok", "wall_s": 299.7,
             "tokens": [[1, 2, 3]], "result_path": ""},
            {"id": "reference", "purpose": "reference", "target": "cpu", "ok": False, "status": "timeout",
             "wall_s": 960.0, "tokens": None, "result_path": ""}]
    detail = timeout_detail("the reference run (the original, on the CPU in float32)", 960.0,
                            [RunRecord.model_validate(r) for r in runs])
    assert "960 s" in detail and "--run-timeout" in detail and "not a porting failure" in detail
    state = {"status": "failed", "reason": detail, "numerics": {"verdict": "not-run", "detail": detail}, "runs": runs}
    assert outcome_label(state) == TIMED_OUT
    assert outcome_label({"status": "failed", "reason": "could not port because x", "runs": runs[:1]}) == NOT_PORTED
    report = {**state, "request": {"model_path": "m"}, "wall_s": 1.0, "findings": [], "patches": []}
    md = render_markdown(report)
    assert "port tokens (on the target): [[1, 2, 3]]" in md, md
    assert "reference tokens (original, CPU float32 via device redirect): none (run reference ended timeout" in md
    assert "cannot be built on a host without CUDA" not in md


# -- honest speed verdicts --------------------------------------------------------------------------------


def test_a_difference_within_the_runs_spread_is_not_comparable() -> None:
    from agents.models import TrialRecord
    from agents.tuning.port import NOT_COMPARABLE, compare, host_spread, performance_sentence

    assert compare(2.7, 75.6, 0.0) == "slower"
    assert compare(2.7, 75.6, 8.9) == NOT_COMPARABLE  # 87.1 tok/s in its trial, 8.8 in the final benchmark
    assert compare(100.0, 95.0, 0.1) == NOT_COMPARABLE and compare(100.0, 50.0, 0.1) == "faster"
    trials = [TrialRecord(id="t1", params={"batch": 4}, value=87.1, status="ok")]
    spread = host_spread([{"spread": 0.05}], trials, {"batch": 4}, 8.8)
    assert spread > 5
    sentence = performance_sentence({"chosen": "tuned", "config": {"batch": 4}, "tokens_per_s": 8.8,
                                     "concurrency": 4, "speedup": 8.8 / 75.6, "vs_original": compare(8.8, 75.6, spread),
                                     "spread": spread, "untuned": {"tokens_per_s": 9.0}, "search_best": {},
                                     "slower_at": []})
    assert "not comparable on this host (spread" in sentence and "SLOWER" not in sentence


# -- the original's own failure ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_model_that_fails_by_itself_is_said_to_at_the_user_s_line_and_nothing_is_reverted(
        tmp_path: Path, npuport_home: Path) -> None:
    r, out = _port(tmp_path, twist="nxt = nxt.view(3, -1)")
    assert r.exit_code == 1, r.output
    report = json.loads((out / "report.json").read_text())
    src = (tmp_path / "m" / "modeling_tiny.py").read_text().splitlines()
    line = next(i for i, ln in enumerate(src, 1) if "nxt.view(3, -1)" in ln)
    assert f"the model fails by itself at modeling_tiny.py:{line}" in report["reason"], report["reason"]
    assert not any(p.get("codemod") == "revert-change" or str(p.get("summary", "")).startswith("revert")
                   for p in report["patches"])
    assert report["numerics"]["verdict"] == "model-fails"
    assert "the model fails by itself:" in r.output  # the CLI's label: not "not ported"
    assert [x["purpose"] for x in report["runs"]].count("reference") == 1


# -- helpers in a module of their own ---------------------------------------------------------------


def test_inserted_helpers_move_to_a_module_beside_the_file_which_imports_them(tmp_path: Path) -> None:
    import subprocess
    import sys

    from agents.fixing.codemods import CODEMODS
    from agents.fixing.helper_module import HELPER_FILE, move_helpers

    src = ("import os\nimport torch\n\n\ndef f(x):\n    return x.cuda()\n\n\ndef g():\n"
           "    return torch.cuda.is_available()\n")
    res = CODEMODS["device-agnostic"][0](src, file="m.py")
    assert res.changed and "def _npuport_device" in res.source  # the codemod inserts them inline
    new, helpers = move_helpers(res.source, src, None)
    assert helpers is not None and "def _npuport_device" in helpers and "def _npuport_device" not in new
    assert "from ._npuport_helpers import" in new and len(new.splitlines()) < len(src.splitlines()) + 8
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(new)
    (pkg / HELPER_FILE).write_text(helpers)
    (pkg / "__init__.py").write_text("")
    for code in ("import m; print(m.f(__import__('torch').ones(1)).device)",  # as a top-level module
                 "import pkg.m as m; print(m.g() in (True, False))"):  # as part of its package (remote code)
        run = subprocess.run([sys.executable, "-c", code], cwd=pkg if code.startswith("import m;") else tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    again, helpers2 = move_helpers(new.replace("return torch.cuda.is_available()", "return 1"), src, helpers)
    assert helpers2 is not None and helpers2.count("def _npuport_device(") == 1
    # written again from its own text, the helper module is the same text: a later fix that adds no helper
    # leaves it out of its commit
    assert move_helpers(again, src, helpers2) == (again, helpers2)


@pytest.mark.slow
def test_the_patch_shows_the_model_s_changes_before_the_helper_module(tmp_path: Path, npuport_home: Path) -> None:
    r, out = _port(tmp_path)
    assert r.exit_code == 0, r.output
    patch = (out / "port.patch").read_text()
    files = [ln.split(" b/", 1)[1] for ln in patch.splitlines() if ln.startswith("diff --git")]
    assert files[-1] == "_npuport_helpers.py" and "modeling_tiny.py" in files[:-1], files
    patched = (out / "patched" / "modeling_tiny.py").read_text()
    assert "def _npuport_device" not in patched and "_npuport_helpers" in patched


# -- whole lines on a pipe ----------------------------------------------------------------------------


def test_piped_tables_print_cells_whole(capsys: Any) -> None:
    from rich.table import Table

    from api.cli_port import print_table

    t = Table(show_header=False)
    long = "no vLLM path: " + "x" * 400
    t.add_row("deployment", long)
    print_table(t)
    out = capsys.readouterr().out
    assert long in out and "…" not in out


def test_port_help_keeps_option_texts_whole() -> None:
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {k: v for k, v in __import__("os").environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-m", "api.cli", "port", "--help"], capture_output=True, text=True, env=env,
                       cwd=REPO_ROOT, timeout=120)
    flat = " ".join(r.stdout.replace("│", " ").split())
    assert "(process: the model's code runs UNISOLATED; auto falls back to it with a warning)" in flat
    assert "[auto|bwrap|process]" in r.stdout


# -- Ctrl-C then resume, at every node ------------------------------------------------------------------

# node -> (a function of ours the node calls, the model's twist that makes the run reach the node)
NODE_SKILLS: dict[str, tuple[str, str]] = {
    "planner": ("agents.nodes.planner.plan_steps", "pass"),
    "environment": ("agents.nodes.environment.resolve_target", "pass"),
    "code_reader": ("agents.nodes.code_reader.scan_tree", "pass"),
    "patcher": ("agents.nodes.patcher.get_policy", "pass"),
    "executor": ("agents.nodes.executor.run_spec", "pass"),
    "validator": ("agents.nodes.validator.reference_run", "pass"),
    # the port fails where the original does not (it runs from the workspace's original/ tree)
    "debugger": ("agents.nodes.debugger.budget_left", 'assert "/original/" in __file__, "port only"'),
    "tuner": ("agents.nodes.tuner.skeleton_tuning", "pass"),
    "reporter": ("agents.nodes.reporter.write_bundle", "pass"),
    "deployer": ("agents.nodes.deployer.run_deployment", "pass"),
}


@pytest.mark.slow
@pytest.mark.parametrize("node", list(NODE_SKILLS))
def test_ctrl_c_in_any_node_then_the_printed_resume_finishes_the_port(
        node: str, tmp_path: Path, npuport_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGINT, delivered while the node runs one of its skills (the node runs in the CLI's main thread,
    where the first Ctrl-C acts at once), then `npuport resume THREAD` as printed."""
    import os
    import signal

    target, twist = NODE_SKILLS[node]
    module, attr = target.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[attr]), attr)
    fired: list[float] = []

    def ctrl_c_once(*a: Any, **k: Any) -> Any:
        if not fired:
            fired.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here, in the node, at once
        return real(*a, **k)

    monkeypatch.setattr(target, ctrl_c_once)
    monkeypatch.setattr("agents.deploy.serving.ensure_vllm_env", _no_index)  # the deployment ends quickly
    model = write_tiny_model(tmp_path / "m", twist=twist)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["port", str(model), "--target", "cpu", "--out", str(out), "--max-runs", "2",
                                 "--serve"])
    assert r.exit_code == 130, r.output
    assert fired and f"in {node}" in r.output, r.output
    thread = r.output.split("npuport resume ", 1)[1].split()[0]
    listed = CliRunner().invoke(app, ["resume"])
    assert thread in listed.output and node in listed.output, listed.output  # listed as resumable, stopped there
    again = CliRunner().invoke(app, ["resume", thread])
    assert again.exit_code in (0, 1), again.output  # a verdict: finished, not refused, not interrupted
    assert "already finished" not in again.output
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == ("failed" if node == "debugger" else "validated"), report["reason"]
    if node != "debugger":
        assert again.exit_code == 0 and json.loads((out / "deployment.json").read_text())["status"] == "failed"
    done = CliRunner().invoke(app, ["resume", thread])
    assert "already finished" in done.output and thread not in CliRunner().invoke(app, ["resume"]).output
