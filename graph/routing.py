"""Conditional routing as pure functions of the state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from agents.state import bundle_of, failure_of, numerics_of, pending_diagnosis_of, runs_of, status_of


def _failed(state: dict[str, Any]) -> bool:
    return status_of(state) == "failed"


def _crashed(state: dict[str, Any]) -> bool:
    """A guarded node raised (graph/guard.py): whatever the node's usual successors, go to the reporter."""
    return failure_of(state) is not None


def after_planner(state: dict[str, Any]) -> Literal["environment", "reporter"]:
    return "reporter" if _failed(state) or _crashed(state) else "environment"


def after_environment(state: dict[str, Any]) -> Literal["code_reader", "reporter"]:
    return "reporter" if _failed(state) or _crashed(state) else "code_reader"


def after_code_reader(state: dict[str, Any]) -> Literal["patcher", "reporter"]:
    return "reporter" if _failed(state) or _crashed(state) else "patcher"


def after_executor(state: dict[str, Any]) -> Literal["validator", "debugger", "reporter"]:
    if _crashed(state):
        return "reporter"
    runs = runs_of(state)
    return "validator" if runs and runs[-1].ok else "debugger"


def after_validator(state: dict[str, Any]) -> Literal["tuner", "debugger", "reporter"]:
    if _crashed(state):
        return "reporter"
    numerics = numerics_of(state)
    verdict = numerics.verdict if numerics else None
    if verdict == "match":
        return "tuner"
    if verdict == "mismatch":
        return "debugger"
    return "reporter"  # the reference could not run: nothing to compare against


def after_debugger(state: dict[str, Any]) -> Literal["patcher", "reporter"]:
    pending = pending_diagnosis_of(state) is not None
    return "patcher" if pending and not _failed(state) and not _crashed(state) else "reporter"


def after_patcher(state: dict[str, Any]) -> Literal["executor", "reporter"]:
    return "reporter" if _failed(state) or _crashed(state) else "executor"


def after_reporter(state: dict[str, Any]) -> Literal["deployer", "__end__"]:
    """The deployment phase follows a validated bundle whose deployment is due (serving on, a generating model)."""
    folder = bundle_of(state).dir
    if _crashed(state) or status_of(state) != "validated" or not folder:
        return "__end__"
    from agents.report.deployment import deployment_due

    report = Path(folder) / "report.json"
    return "deployer" if report.is_file() and deployment_due(json.loads(report.read_text())) else "__end__"
