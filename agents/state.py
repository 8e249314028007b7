"""The state of a port: its fields (``PortFields``; the graph's ``PortState`` adds the chat) and one typed
reader per field.

Nodes take the state as LangGraph hands it (a dict of JSON-able values, so checkpoints stay small and
portable) and return updates as dicts; every read goes through a reader here, as the request's goes
through ``request_of`` (agents/request.py). A reader returns the field's typed record (agents/models.py,
sandbox.targets.Target) or its default when the field is unset; no module outside this one reads the
state by string key (tests/test_state_readers.py holds it). A required field read before the node that
sets it ran (``workdir_of``, ``target_of``) raises LookupError: a bug in the graph's order, which the guard
records as one, not the model's failure.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

# typing_extensions' TypedDict: pydantic (Studio's schemas, the API) reads it on Python 3.11 too.
from typing_extensions import TypedDict

from agents.models import (
    BundleRecord,
    Counters,
    DeploymentBrief,
    Diagnosis,
    EnvironmentRecord,
    FailureRecord,
    Finding,
    Numerics,
    Patch,
    Plan,
    RunRecord,
    Tuning,
)
from sandbox.targets import REFERENCE_TARGET, TARGETS, Target, TargetSpec

State = Mapping[str, Any]
"""The state as a node or a reader gets it: LangGraph's dict (or a checkpoint's values, a job's)."""


class PortFields(TypedDict, total=False):
    """The state's fields. graph/state.py's ``PortState`` adds the chat ``messages`` (LangGraph's reducer:
    importing it here would load LangGraph for every module of agents/)."""

    goal: str
    """The user's goal text, e.g. "port the model in ./m to Ascend 910B and maximise throughput"."""
    request: dict[str, Any]
    """agents.request.PortRequest, dumped: model path, target, chip, budgets, output folder."""
    plan: dict[str, Any]
    """agents.models.Plan: the planner's steps and the policy in charge."""
    target: dict[str, Any]
    """The resolved target (sandbox.targets.Target: name, device, bootstrap, options, env, reason)."""
    environment: dict[str, Any]
    """agents.models.EnvironmentRecord: the environment node's notes, the model's resolved pins and the
    layered venv's python (or None)."""
    workdir: str
    """The workspace: model/ (git, one commit per patch) and runs/ (harness results)."""
    original_digest: str
    """sha256 over the user's original tree, taken when it was copied."""
    entry: dict[str, Any]
    """How to run the model: the manifest dict of docs/architecture.md."""
    findings: list[dict[str, Any]]
    """agents.models.Finding records from the static scan."""
    patches: Annotated[list[dict[str, Any]], operator.add]
    """agents.models.Patch records, in commit order."""
    runs: Annotated[list[dict[str, Any]], operator.add]
    """agents.models.RunRecord records, in run order."""
    diagnoses: Annotated[list[dict[str, Any]], operator.add]
    """agents.models.Diagnosis records from the debugger."""
    pending_diagnosis: dict[str, Any] | None
    """The diagnosis whose fix the patcher applies next."""
    static_fixes_done: bool
    """The patcher has applied the fixes planned from the static scan (later rounds fix diagnoses)."""
    numerics: dict[str, Any]
    """agents.models.Numerics: the validator's verdict."""
    perf: dict[str, Any]
    """agents.validation.perf_evidence.analyse: decode profiles (original and port) and performance pathologies."""
    tuning: dict[str, Any]
    """agents.models.Tuning: the tuner's trials, best configuration and measured speed-up."""
    bundle: dict[str, Any]
    """agents.models.BundleRecord: the reporter's output: folder, files written (report, patch, patched tree,
    deploy files), note."""
    deployment: dict[str, Any]
    """agents.models.DeploymentBrief: the deployment phase's outcome (status, one-line summary and the bundle's
    deployment.json that holds the record)."""
    counters: dict[str, int]
    """agents.models.Counters: port_runs, reference_runs."""
    started_at: float
    """Wall-clock start of the port (time.time()), for the wall budget and the report."""
    status: str
    """running | failed | validated."""
    reason: str
    """One line: why the port ended as it did."""
    failure: dict[str, Any]
    """agents.models.FailureRecord, set when a node raised (graph/guard.py): node, error (type name), kind (user |
    port | internal, from the error's class: the CLI's exit code), expected (an npuport error rather than a bug),
    message (first line), fields (the error's structured details), traceback (a file in the workspace; never in
    the state)."""
    trace: Annotated[list[dict[str, Any]], operator.add]
    """Agent steps, in order (progress lines, SSE events, trace.jsonl)."""


def _raw(state: State | None, field: str) -> Any:
    return (state or {}).get(field)


# --- the request and the plan (the request's reader is agents/request.py request_of) ---------------


def request_fields_of(state: State | None) -> dict[str, Any]:
    """The request's fields as the caller sent them, unvalidated (a copy): the planner tells the fields a caller
    set from the defaults, and a resume sends them again. Everything else reads ``request_of(state)``."""
    return dict(_raw(state, "request") or {})


def goal_of(state: State | None) -> str:
    return str(_raw(state, "goal") or "")


def plan_of(state: State | None) -> Plan:
    return Plan.model_validate(_raw(state, "plan") or {})


def started_at_of(state: State | None) -> float | None:
    """When the port started (time.time()); None before the planner ran."""
    value = _raw(state, "started_at")
    return float(value) if value else None


# --- the target and the environment ---------------------------------------------------------------


def _target(raw: Mapping[str, Any]) -> Target:
    return Target(str(raw["name"]), str(raw.get("device") or ""), raw.get("bootstrap"), dict(raw.get("options") or {}),
                  dict(raw.get("env") or {}), str(raw.get("reason") or ""))


def target_if_resolved(state: State | None) -> Target | None:
    """The resolved target, or None before the environment node resolved it (a port that failed earlier)."""
    raw = _raw(state, "target")
    return _target(raw) if raw and raw.get("name") else None


def target_of(state: State | None) -> Target:
    """The resolved target: the environment node resolves it once, every later node reads it here."""
    target = target_if_resolved(state)
    if target is None:
        raise LookupError("the port's target is not resolved yet (the environment node resolves it)")
    return target


def target_name_of(state: State | None) -> str:
    """The resolved target's name, "" before it was resolved (records and reports name it)."""
    target = target_if_resolved(state)
    return target.name if target else ""


def capabilities_of(state: State | None) -> TargetSpec:
    """The resolved target's capabilities (its TargetSpec in the registry); before the environment node
    resolved one, the reference target's (the host CPU: no NPU rules apply)."""
    return TARGETS.get(target_name_of(state), TARGETS[REFERENCE_TARGET])


def target_dict(target: Target) -> dict[str, Any]:
    """A Target as the state holds it (the environment node's update)."""
    return {"name": target.name, "device": target.device, "bootstrap": target.bootstrap, "options": target.options,
            "env": target.env, "reason": target.reason}


def environment_of(state: State | None) -> EnvironmentRecord:
    return EnvironmentRecord.model_validate(_raw(state, "environment") or {})


# --- the workspace and what the code reader found -------------------------------------------------


def workdir_if_set(state: State | None) -> Path | None:
    """The port's workspace, or None before the code reader made it."""
    raw = _raw(state, "workdir")
    return Path(raw) if raw else None


def workdir_of(state: State | None) -> Path:
    """The port's workspace (model/ under git, runs/): the code reader makes it."""
    workdir = workdir_if_set(state)
    if workdir is None:
        raise LookupError("the port has no workspace yet (the code reader makes it)")
    return workdir


def original_digest_of(state: State | None) -> str:
    return str(_raw(state, "original_digest") or "")


def entry_of(state: State | None) -> dict[str, Any]:
    """How to run the model: the manifest dict of docs/architecture.md (a copy; {} before the code reader).
    It stays the documented dict the harness spec and report.json carry."""
    return dict(_raw(state, "entry") or {})


def findings_of(state: State | None) -> list[Finding]:
    return [Finding.model_validate(f) for f in _raw(state, "findings") or []]


# --- fixing, running and validating ---------------------------------------------------------------


def patches_of(state: State | None) -> list[Patch]:
    return [Patch.model_validate(p) for p in _raw(state, "patches") or []]


def runs_of(state: State | None) -> list[RunRecord]:
    return [RunRecord.model_validate(r) for r in _raw(state, "runs") or []]


def diagnoses_of(state: State | None) -> list[Diagnosis]:
    return [Diagnosis.model_validate(d) for d in _raw(state, "diagnoses") or []]


def pending_diagnosis_of(state: State | None) -> Diagnosis | None:
    raw = _raw(state, "pending_diagnosis")
    return Diagnosis.model_validate(raw) if raw else None


def static_fixes_done_of(state: State | None) -> bool:
    return bool(_raw(state, "static_fixes_done"))


def counters_of(state: State | None) -> Counters:
    return Counters.model_validate(_raw(state, "counters") or {})


def numerics_of(state: State | None) -> Numerics | None:
    """The validator's verdict (or the debugger's, for a model that fails by itself); None before one."""
    raw = _raw(state, "numerics")
    return Numerics.model_validate(raw) if raw else None


def perf_of(state: State | None) -> dict[str, Any]:
    """The decode-profile evidence (agents/validation/perf_evidence.py ``analyse``: profiled, pathologies,
    note, port, reference, rows; a copy, {} before validation): the dict report.json carries."""
    return dict(_raw(state, "perf") or {})


def tuning_of(state: State | None) -> Tuning:
    """The tuner's record; before the tuner ran, an empty one (status "skipped")."""
    return Tuning.model_validate(_raw(state, "tuning") or {})


def tuned_of(state: State | None) -> bool:
    """The tuner has written its record (a port that stopped before tuning has none)."""
    return bool(_raw(state, "tuning"))


# --- the outcome ----------------------------------------------------------------------------------


def status_of(state: State | None) -> str:
    """running | failed | validated; "" before the planner ran."""
    return str(_raw(state, "status") or "")


def reason_of(state: State | None) -> str:
    return str(_raw(state, "reason") or "")


def failure_of(state: State | None) -> FailureRecord | None:
    """The node that raised and why (graph/guard.py), or None when none did."""
    raw = _raw(state, "failure")
    return FailureRecord.model_validate(raw) if raw else None


def bundle_of(state: State | None) -> BundleRecord:
    """The reporter's bundle; before the reporter ran, an empty record (``dir`` "")."""
    return BundleRecord.model_validate(_raw(state, "bundle") or {})


def deployment_of(state: State | None) -> DeploymentBrief | None:
    """The deployment phase's brief, or None when it did not run."""
    raw = _raw(state, "deployment")
    return DeploymentBrief.model_validate(raw) if raw else None


def trace_of(state: State | None) -> list[dict[str, Any]]:
    """The agents' steps (agents/trace.py ``step`` dicts: agent, summary, detail, t), in order."""
    return [t for t in _raw(state, "trace") or [] if isinstance(t, dict)]


APPENDED_FIELDS = ("patches", "runs", "diagnoses", "trace")
"""The fields whose updates LangGraph appends (``operator.add`` above) rather than replaces."""


def merged(state: State | None, update: Mapping[str, Any]) -> dict[str, Any]:
    """The state as it reads after ``update`` (appended fields appended, the others replaced), for a node that
    hands the state on to a skill before LangGraph has applied its update."""
    out = dict(state or {})
    for name, value in update.items():
        out[name] = [*(out.get(name) or []), *value] if name in APPENDED_FIELDS else value
    return out


def messages_of(state: State | None) -> list[Any]:
    """The chat messages (langchain messages, or their dicts as an API caller sends them), in order."""
    return list(_raw(state, "messages") or [])


REPORTED_FIELDS = ("request", "goal", "plan", "target", "entry", "findings", "patches", "runs", "diagnoses",
                   "numerics", "tuning", "counters", "perf", "original_digest", "workdir", "started_at", "failure",
                   "environment")


def recorded(state: State | None) -> dict[str, Any]:
    """The state's fields as report.json records them, as JSON data, unread: the report is the state written
    down, and the reporter's last-resort report must not depend on a record that no longer validates."""
    return {name: (state or {}).get(name) for name in REPORTED_FIELDS}
