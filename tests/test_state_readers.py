"""The state is read through its readers (agents/state.py), as the request is through ``request_of``: no module
of agents/, graph/ or api/ reads a state field by string key, nor a target as a dict; and each reader gives
its typed record, or its default when the field is unset."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from agents import state as st
from agents.models import (
    BundleRecord,
    Citation,
    Counters,
    DeploymentBrief,
    Diagnosis,
    EnvironmentRecord,
    FailureRecord,
    Finding,
    HazardCategory,
    Numerics,
    Patch,
    Plan,
    RunRecord,
    Severity,
    StructuredException,
    Tuning,
)
from sandbox.targets import REFERENCE_TARGET, TARGETS, Target

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "graph", "api")
READERS_MODULE = "agents/state.py"
FIELDS = frozenset(get_type_hints(st.PortFields)) | {"messages"}
# Names that hold the state where a node or a service has it: the node's argument, a checkpoint's values
# (``snap.values``, ``result.values``, ``values``), a check's ``c.state``; plus any argument annotated as the state.
STATE_NAMES = frozenset({"state", "values"})
STATE_TYPES = frozenset({"PortState", "PortFields", "State"})
# The ad-hoc readers of the resolved target that target_of / capabilities_of replace.
TARGET_DICT_READERS = frozenset({"target_from_dict", "target_to_dict"})


def _key(node: ast.AST) -> str | None:
    """The string key a read uses: ``x["k"]`` or ``x.get("k", ...)`` / ``x.pop`` / ``x.setdefault``."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
        return node.slice.value if isinstance(node.slice.value, str) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault") and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def _holder(node: ast.AST) -> ast.AST:
    return node.value if isinstance(node, ast.Subscript) else node.func.value  # type: ignore[attr-defined]


def _state_params(tree: ast.AST) -> set[str]:
    """Arguments annotated as the state (``state: PortState``), whatever their name."""
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
                annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if annotation.split("[")[0].split(".")[-1] in STATE_TYPES:
                    out.add(arg.arg)
    return out


def _is_state(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in STATE_NAMES or node.id in names
    return isinstance(node, ast.Attribute) and node.attr in ("state", "values")


def offences(path: Path, rel: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = _state_params(tree)
    out = []

    def bad(node: ast.AST, why: str) -> None:
        out.append(f"{rel}:{getattr(node, 'lineno', '?')}: {why}: {ast.unparse(node)[:140]}")

    for node in ast.walk(tree):
        key = _key(node)
        if key in FIELDS and _is_state(_holder(node), names):
            bad(node, f"reads the state's {key!r} by key (use agents/state.py's reader)")
        elif key is not None and isinstance(_holder(node), ast.Name) and _holder(node).id == "target":  # type: ignore[attr-defined]
            bad(node, "reads a target as a dict (a Target has attributes: target_of(state))")
        elif key == "name" and _key(_inner(_holder(node))) == "target":
            bad(node, "reads the target's name from a dict (target_name_of / capabilities_of)")
        elif isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in TARGET_DICT_READERS:
            bad(node, "turns the target into a dict or back (agents/state.py target_of / target_dict)")
    return out


def _inner(node: ast.AST) -> ast.AST:
    """``(x.get("target") or {})`` -> ``x.get("target")``."""
    if isinstance(node, ast.BoolOp) and node.values:
        return node.values[0]
    return node


def _files() -> list[tuple[Path, str]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != READERS_MODULE:
                out.append((path, rel))
    return out


def test_no_string_key_read_of_the_state_outside_its_readers() -> None:
    found = [o for path, rel in _files() for o in offences(path, rel)]
    assert found == [], "read the state through agents/state.py:\n" + "\n".join(found)


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    """The scan is not vacuous: each form of a state read is reported, a record's own keys are not."""
    sample = tmp_path / "x.py"
    sample.write_text(
        "def node(state, snap, c, report):\n"
        "    a = state['workdir']\n"                                   # 2
        "    b = state.get('runs') or []\n"                            # 3
        "    d = snap.values.get('status')\n"                          # 4
        "    e = c.state.get('entry') or {}\n"                         # 5
        "    f = (report.get('target') or {}).get('name', '')\n"       # 6
        "    g = target_from_dict(report['target'])\n"                 # 7
        "    h = report.get('runs')\n"                                 # 8: a report's own record, not the state
        "    i = state.get('model_path')\n"                            # 9: not a field of the state
        "def other(s: PortState, target):\n"
        "    return s.get('numerics'), target.get('options')\n")       # 11 twice
    found = offences(sample, "x.py")
    lines = sorted(int(o.split(":")[1]) for o in found)
    assert lines == [2, 3, 4, 5, 6, 7, 11, 11], found


# --- the readers ------------------------------------------------------------------------------------


def _run(**kw: Any) -> RunRecord:
    return RunRecord(**{"id": "run-1", "purpose": "port", "target": "cpu", "ok": True, "status": "ok", "wall_s": 1.5,
                        "result_path": "/tmp/r.json", **kw})


def test_every_reader_gives_its_default_on_an_empty_state() -> None:
    for empty in ({}, None):
        assert st.goal_of(empty) == "" and st.status_of(empty) == "" and st.reason_of(empty) == ""
        assert st.plan_of(empty) == Plan() and st.counters_of(empty) == Counters()
        assert st.environment_of(empty) == EnvironmentRecord() and st.tuning_of(empty) == Tuning()
        assert st.bundle_of(empty) == BundleRecord() and st.bundle_of(empty).dir == ""
        assert st.runs_of(empty) == [] and st.patches_of(empty) == [] and st.diagnoses_of(empty) == []
        assert st.findings_of(empty) == [] and st.trace_of(empty) == [] and st.messages_of(empty) == []
        assert st.pending_diagnosis_of(empty) is None and st.numerics_of(empty) is None
        assert st.failure_of(empty) is None and st.deployment_of(empty) is None
        assert st.started_at_of(empty) is None and st.static_fixes_done_of(empty) is False
        assert st.original_digest_of(empty) == "" and st.entry_of(empty) == {} and st.perf_of(empty) == {}
        assert st.request_fields_of(empty) == {}
        assert st.workdir_if_set(empty) is None and st.target_if_resolved(empty) is None
        assert st.target_name_of(empty) == ""
        assert st.capabilities_of(empty) is TARGETS[REFERENCE_TARGET]  # no NPU rules before a target is resolved
    with pytest.raises(LookupError, match="workspace"):
        st.workdir_of({})
    with pytest.raises(LookupError, match="environment node"):
        st.target_of({})


def test_the_target_round_trips_and_its_capabilities_come_from_the_registry() -> None:
    name = next(n for n, s in TARGETS.items() if s.npu_like and not s.chooser)
    target = Target(name, "npu:0", "m:f", {"chip": "x", "matrix_path": "/m.json"}, {"E": "1"}, "requested")
    state = {"target": st.target_dict(target)}
    assert st.target_of(state) == target == st.target_if_resolved(state)
    assert st.target_name_of(state) == name and st.capabilities_of(state) is TARGETS[name]


def test_each_record_round_trips_through_the_state() -> None:
    """What a node writes (its record, dumped) is what the reader gives back: nothing dropped, nothing added."""
    citation = Citation(source="recipe:H1", title="t")
    exc = StructuredException(type="E", message="m")
    records: dict[str, Any] = {
        "plan": Plan(steps=["a"], policy="rule", source="rules", target="auto", chip="c", objective="latency",
                     constraints=["x"], budget={"max_runs": 3}),
        "counters": Counters(port_runs=2, reference_runs=1),
        "environment": EnvironmentRecord(notes=["n"], resolution={"release_choice": {"chosen": "4.40.0"}},
                                         python="/venv/bin/python"),
        "tuning": Tuning(status="done", best={"batch": 2}, tuned={"speedup": 1.3}, serving={"best": {"x": 1},
                                                                                           "measured_on": "npu"}),
        "bundle": BundleRecord(dir="/b", files={"report_md": "/b/report.md"}, note="n"),
        "deployment": DeploymentBrief(status="served", summary="s", file="/b/deployment.json"),
        "failure": FailureRecord(node="patcher", error="ValueError", kind="internal", expected=False, message="m",
                                 fields={"k": 1}, traceback="/t.txt", t=1.0),
        "numerics": Numerics(verdict="match", token_agreement=1.0, detail="d"),
        "pending_diagnosis": Diagnosis(id="diag-1", run_id="run-1", signature="s", kind="k", summary="x", fix="f",
                                       params={"p": 1}, citations=[citation]),
    }
    lists: dict[str, list[Any]] = {
        "runs": [_run(exception=exc, tokens=[[1, 2]], timings={"run_s": 1.0})],
        "patches": [Patch(id="patch-1", commit="a" * 40, summary="s", finding_ids=["f1"], files=["m.py"],
                          codemod="c", citations=[citation])],
        "diagnoses": [records["pending_diagnosis"]],
        "findings": [Finding(id="f1", hazard="H1", rule="cuda-call", file="m.py", line=3, message="m",
                             category=HazardCategory.BLOCKS_RUNNING, severity=Severity.HIGH, citations=[citation])],
    }
    state = {**{k: v.model_dump(mode="json") for k, v in records.items()},
             **{k: [r.model_dump(mode="json") for r in v] for k, v in lists.items()}}
    readers = {"plan": st.plan_of, "counters": st.counters_of, "environment": st.environment_of,
               "tuning": st.tuning_of, "bundle": st.bundle_of, "deployment": st.deployment_of,
               "failure": st.failure_of, "numerics": st.numerics_of, "pending_diagnosis": st.pending_diagnosis_of}
    for name, reader in readers.items():
        assert reader(state) == records[name], name
        assert reader(state).model_dump(mode="json") == state[name], name  # the dict the state held, exactly
    assert st.runs_of(state) == lists["runs"] and st.patches_of(state) == lists["patches"]
    assert st.diagnoses_of(state) == lists["diagnoses"] and st.findings_of(state) == lists["findings"]


def test_the_guard_s_failure_and_the_deployer_s_brief_read_as_their_records(tmp_path: Path) -> None:
    """The dicts other writers put in the state (graph/guard.py, the deployment phase) hold no key their
    records lack: reading them drops nothing."""
    from agents.report.deployment import deployment_brief
    from graph.guard import failure_record

    failure = failure_record("patcher", ValueError("bad value"), {"workdir": str(tmp_path)})
    assert st.failure_of({"failure": failure}).model_dump(mode="json") == failure  # type: ignore[union-attr]
    brief = deployment_brief({"status": "served", "tokens": {"ok": True}, "throughput": {}}, tmp_path)
    assert st.deployment_of({"deployment": brief}).model_dump(mode="json") == brief  # type: ignore[union-attr]


def test_scalars_workdir_and_the_merge_of_an_update(tmp_path: Path) -> None:
    state = {"goal": "port it", "status": "failed", "reason": "r", "started_at": 12.5, "static_fixes_done": True,
             "original_digest": "abc", "workdir": str(tmp_path), "entry": {"name": "m", "shrink": {}},
             "request": {"model_path": "m", "tune": True}, "runs": [_run().model_dump(mode="json")],
             "trace": [{"agent": "planner", "summary": "s"}]}
    assert (st.goal_of(state), st.status_of(state), st.reason_of(state)) == ("port it", "failed", "r")
    assert st.started_at_of(state) == 12.5 and st.static_fixes_done_of(state) is True
    assert st.original_digest_of(state) == "abc" and st.workdir_of(state) == tmp_path
    assert st.request_fields_of(state) == {"model_path": "m", "tune": True}
    entry = st.entry_of(state)
    entry["name"] = "changed"  # a copy: a node that edits it changes nothing until it returns an update
    assert st.entry_of(state)["name"] == "m"
    after = st.merged(state, {"runs": [_run(id="run-2").model_dump(mode="json")], "status": "running"})
    assert [r.id for r in st.runs_of(after)] == ["run-1", "run-2"] and st.status_of(after) == "running"
    assert st.runs_of(state)[0].id == "run-1" and len(st.runs_of(state)) == 1  # the state itself unchanged
    assert set(st.recorded(state)) == set(st.REPORTED_FIELDS)
