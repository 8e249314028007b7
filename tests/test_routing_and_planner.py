"""Pure pieces of the graph: routing functions, goal parsing, budgets, the debugger's signatures."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agents.fixing.diagnosis import budget_left, classify
from agents.models import Diagnosis, Frame, RunRecord, StructuredException
from agents.request import parse_goal
from graph import routing
from knowledge.errors import GoalError


def test_parse_goal_reads_path_chip_objective() -> None:
    req = parse_goal("port the model in examples/ocr_mini to Ascend 910B and maximise throughput")
    assert req.model_path == "examples/ocr_mini"
    assert req.chip == "910b" and req.objective == "throughput" and req.tune
    req = parse_goal("port ./m to Atlas 310P, minimise latency", {"target": "cpu"})
    assert req.model_path == "./m" and req.chip == "310p" and req.objective == "latency" and req.target == "cpu"


def test_parse_goal_without_a_model_is_a_clear_error() -> None:
    with pytest.raises(GoalError, match="names no model folder"):
        parse_goal("make it fast please")


def _run(ok: bool) -> dict[str, object]:
    return RunRecord(id="run-1", purpose="port", target="cpu", ok=ok, status="ok" if ok else "error", wall_s=1.0,
                     result_path="r.json").model_dump(mode="json")


PENDING = Diagnosis(id="d", run_id="run-1", signature="s", kind="k", summary="x", fix="f").model_dump(mode="json")


@pytest.mark.parametrize(
    ("fn", "state", "expected"),
    [
        (routing.after_planner, {"status": "failed"}, "reporter"),
        (routing.after_planner, {"status": "running"}, "environment"),
        (routing.after_code_reader, {"status": "running"}, "patcher"),
        (routing.after_executor, {"runs": [_run(True)]}, "validator"),
        (routing.after_executor, {"runs": [_run(False)]}, "debugger"),
        (routing.after_validator, {"numerics": {"verdict": "match"}}, "tuner"),
        (routing.after_validator, {"numerics": {"verdict": "mismatch"}}, "debugger"),
        (routing.after_validator, {"numerics": {"verdict": "not-run"}}, "reporter"),
        (routing.after_debugger, {"pending_diagnosis": PENDING}, "patcher"),
        (routing.after_debugger, {"pending_diagnosis": None, "status": "failed"}, "reporter"),
    ],
)
def test_routing(fn, state, expected) -> None:  # type: ignore[no-untyped-def]
    assert fn(state) == expected


def test_budgets() -> None:
    req = {"max_runs": 2, "max_wall_s": 100}
    assert budget_left({"request": req, "counters": {"port_runs": 1}, "started_at": time.time()})[0]
    ok, why = budget_left({"request": req, "counters": {"port_runs": 2}, "started_at": time.time()})
    assert not ok and "2 sandbox runs" in why
    ok, why = budget_left({"request": req, "counters": {"port_runs": 0}, "started_at": time.time() - 101})
    assert not ok and "wall-time" in why


def _exc(type_: str, message: str, line: int = 7) -> StructuredException:
    return StructuredException(type=type_, message=message, frames=[
        Frame(file="/usr/lib/python3/x.py", line=1), Frame(file="modeling.py", line=line, in_model=True)])


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_exc("ModuleNotFoundError", "No module named 'flash_attn'"), "missing-cuda-module"),
        (_exc("ModuleNotFoundError", "No module named 'einops'"), "missing-module"),
        (_exc("AssertionError", "Torch not compiled with CUDA enabled"), "cuda-assert"),
        (_exc("RuntimeError",
              "Expected all tensors to be on the same device, but found at least two devices, npu:0 and cpu!"),
         "device-mismatch"),
        (_exc("RuntimeError", "call aclnnRepeatInterleaveIntWithDim failed, detail:EZ1001: self not implemented for "
              "DT_DOUBLE, should be in dtype support list [DT_FLOAT,]"), "npu-dtype"),
        (_exc("RuntimeError", "The operator 'aten::isneginf' would execute its main computation on CPU through "
              "dispatcher backend fallback"), "npu-fallback-disabled"),
        (_exc("ZeroDivisionError", "division by zero"), "exception"),
        (StructuredException(type="Timeout", message="killed"), "timeout"),
    ],
)
def test_failure_signatures(exc: StructuredException, kind: str) -> None:
    sig = classify(exc)
    assert sig.kind == kind
    if exc.frames:
        assert sig.frame is not None and sig.frame.file == "modeling.py"
        assert "modeling.py:7" in sig.key or kind == "timeout"


def test_same_failure_at_another_line_has_another_signature() -> None:
    a = classify(_exc("AssertionError", "Torch not compiled with CUDA enabled", 7))
    b = classify(_exc("AssertionError", "Torch not compiled with CUDA enabled", 9))
    assert a.key != b.key and a.kind == b.kind


def test_rule_policy_stops_when_a_fix_did_not_help() -> None:
    from agents.policies.rule import RulePolicy

    policy = RulePolicy()
    exc = _exc("AssertionError", "Torch not compiled with CUDA enabled")
    first = policy.diagnose("run-1", exc, [])
    assert first.fix == "device-agnostic"
    second = policy.diagnose("run-2", exc, [first])
    assert second.fix is None and "came back" in second.summary


def test_workspace_commits_and_diffs(tmp_path: Path) -> None:
    from agents.workspace import Workspace, tree_digest

    orig = tmp_path / "orig"
    orig.mkdir()
    (orig / "m.py").write_text("x = 1\n")
    before = tree_digest(orig)
    ws = Workspace.create(orig, tmp_path / "ws")
    (ws.model_dir / "m.py").write_text("x = 2\n")
    sha = ws.commit("change x")
    assert sha and ws.changed_files(sha) == ["m.py"]
    assert "-x = 1\n+x = 2" in ws.diff_from_original()
    assert ws.commit("nothing") is None
    assert tree_digest(orig) == before
