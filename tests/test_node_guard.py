"""Every graph node is guarded (graph/guard.py): an exception inside a node, whether an npuport error
(EnvBuildError, a port failure: exit 1) or a bug (RuntimeError: exit 3), ends the run with a partial
bundle and a report naming the failed node, an exit code derived from the error's class and one line
on stderr, never a traceback.

Faults are injected by replacing one skill that the node calls (a real function of ours, raising);
everything else is real: the graph, the workspace (git), the subprocess sandbox runs on the CPU target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from api.cli import app
from graph.guard import failure_record
from knowledge.errors import EnvBuildError, GoalError, WorkspaceError, first_line
from tests.tiny_models import write_tiny_model

# node -> (module attribute the node calls, model twist that makes the run reach the node, runs before it)
SKILLS: dict[str, tuple[str, str]] = {
    "planner": ("agents.nodes.planner.plan_steps", "pass"),
    "environment": ("agents.nodes.environment.resolve_target", "pass"),
    "code_reader": ("agents.nodes.code_reader.scan_tree", "pass"),
    "patcher": ("agents.nodes.patcher.get_policy", "pass"),
    "executor": ("agents.nodes.executor.run_spec", "pass"),
    "validator": ("agents.nodes.validator.reference_run", "pass"),
    "debugger": ("agents.nodes.debugger.budget_left", "scale = 1 / 0"),  # the first run fails: the debugger runs
    "tuner": ("agents.nodes.tuner.skeleton_tuning", "pass"),
    "reporter": ("agents.nodes.reporter.write_bundle", "pass"),
}
# Nodes reached without a sandbox run are quick; the others run the tiny model in a subprocess.
QUICK = ("planner", "environment", "code_reader", "patcher", "executor")
ERRORS = (EnvBuildError("the model's pins cannot be resolved"), RuntimeError("boom: an npuport bug"))


def _cases() -> list[Any]:
    out = []
    for node in SKILLS:
        for exc in ERRORS:
            marks = () if node in QUICK else (pytest.mark.slow,)
            out.append(pytest.param(node, exc, id=f"{node}-{type(exc).__name__}", marks=marks))
    return out


def _raiser(exc: Exception) -> Any:
    def raise_(*_a: Any, **_k: Any) -> Any:
        raise exc

    return raise_


@pytest.mark.parametrize(("node", "exc"), _cases())
def test_a_failing_node_ends_with_a_partial_bundle(node: str, exc: Exception, tmp_path: Path, npuport_home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target, twist = SKILLS[node]
    module, attr = target.rsplit(".", 1)
    monkeypatch.setattr(f"{module}.{attr}", _raiser(exc))
    model = write_tiny_model(tmp_path / "m", twist=twist)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["port", str(model), "--target", "cpu", "--out", str(out), "--max-runs", "2"])

    assert r.exit_code == (1 if isinstance(exc, EnvBuildError) else 3), r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.stderr + r.stdout
    failed_lines = [ln for ln in r.stderr.splitlines() if "step failed" in ln]
    assert len(failed_lines) == 1 and f"the {node} step failed: {type(exc).__name__}: {exc}" in failed_lines[0]

    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed"
    assert report["failure"]["node"] == node and report["failure"]["error"] == type(exc).__name__
    assert report["failure"]["expected"] is isinstance(exc, EnvBuildError)
    assert report["failure"]["kind"] == ("port" if isinstance(exc, EnvBuildError) else "internal")
    md = (out / "report.md").read_text()
    assert "## Failure" in md and f"`{node}`" in md and "partial bundle" in md
    tb = (out / "failure-traceback.txt").read_text()
    assert tb.startswith("Traceback") and str(exc) in tb
    # the traceback is a file, never part of the state (report.json holds the state's records)
    assert "Traceback" not in json.dumps(report)

    # Nothing computed before the failure is lost.
    agents = [json.loads(line)["agent"] for line in (out / "trace.jsonl").read_text().splitlines()]
    order = list(SKILLS)
    for earlier in order[: order.index(node)]:
        if earlier not in ("debugger",) and not (node == "debugger" and earlier == "validator"):
            assert earlier in agents, (earlier, agents)
    if order.index(node) > order.index("code_reader"):
        assert report["findings"], "the scan's findings were lost"
    if order.index(node) > order.index("executor"):
        assert report["runs"], "the sandbox runs were lost"
    if node not in ("planner", "environment", "code_reader", "reporter"):
        assert (out / "port.patch").exists(), "the partial bundle lacks the diff so far"


def test_the_failure_record_tells_the_kind_by_the_class(tmp_path: Path) -> None:
    """A user's mistake, a port failure, a broken host and a bug are told apart by the class, never by
    the message's words; structured fields that JSON can hold are kept."""
    state = {"workdir": str(tmp_path)}
    cases = [(GoalError("unknown chip 'h100'", value="h100", choices=["910b", "a3"]), "user", True),
             (EnvBuildError("the model's pins cannot be resolved"), "port", True),
             (WorkspaceError("git is not installed"), "internal", True),
             (RuntimeError("unknown chip 'h100'"), "internal", False)]  # a bug, whatever its words
    for exc, kind, expected in cases:
        rec = failure_record("planner", exc, state)
        assert (rec["kind"], rec["expected"], rec["error"]) == (kind, expected, type(exc).__name__)
        assert rec["traceback"] and Path(rec["traceback"]).is_file()
    rec = failure_record("planner", GoalError("bad", value="h100", path=tmp_path), state)
    assert rec["fields"] == {"value": "h100"}  # a Path is not kept in the state


def test_first_line_never_raises() -> None:
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line(ValueError("\n\n  second\nthird")) == "second"
    assert first_line(KeyError("k")) == "'k'"
    assert first_line("abcdef", 3) == "abc"


def test_each_node_writes_a_chat_message(tmp_path: Path, npuport_home: Path) -> None:
    """PortState.messages holds one AI message per node run, so Studio's chat shows the run."""
    from graph.runner import run_port

    state = run_port({"request": {"model_path": str(tmp_path / "missing"), "target": "cpu"}}, "t-msg")
    names = [m.name for m in state["messages"]]
    # one per node, then the reporter's reply to the chat (graph/conversation.py) last
    assert names == ["planner", "reporter", "npuport"]
    assert "does not exist" in state["messages"][0].content
