"""planner: goal text -> PortRequest, and the plan of steps. Resolves the target once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agents.llm.assist import llm_enabled, plan_goal
from agents.request import PortRequest, parse_goal, plan_steps
from agents.state import goal_of, request_fields_of, started_at_of
from agents.trace import step
from knowledge.errors import GoalError, first_line


def _explicit(goal: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The request fields the caller set, as opposed to what the rule parser read from the goal (the
    service sends a whole parsed request): those the LLM's reading of the goal may replace."""
    try:
        ruled = parse_goal(goal, {"model_path": raw.get("model_path") or "."}).model_dump()
    except (GoalError, ValueError):
        return raw
    return {k: v for k, v in raw.items() if k in ("model_path", "policy") or k not in ruled or ruled[k] != v}


def planner_node(state: dict[str, Any]) -> dict[str, Any]:
    """Turn the goal (text or structured request) into a PortRequest and a plan."""
    started = time.time()
    raw = request_fields_of(state)
    goal = goal_of(state)
    source, llm_note = "rules", ""
    constraints: list[str] = []
    records: list[dict[str, Any]] = []
    if goal and llm_enabled(raw.get("policy")):
        # The LLM reads the goal (structured output); explicit request fields still win over it, and
        # the rule parser reads what it left out, or everything when it failed.
        fields, llm_note, records = plan_goal(goal)
        if fields is not None:
            constraints = list(fields.pop("constraints", None) or [])
            if raw.get("model_path"):  # a folder the caller named (the service confined it) is never replaced
                fields.pop("model_path", None)
            raw = {**{k: v for k, v in fields.items() if v is not None}, **_explicit(goal, raw)}
            source = "llm"
    try:
        req = parse_goal(goal, raw) if goal else PortRequest(**raw)
    except (GoalError, ValueError) as exc:
        reason = first_line(exc)
        return {"status": "failed", "reason": f"cannot understand the goal: {reason}", "started_at": started,
                "trace": [step("planner", f"goal not understood: {reason}")]}
    path = Path(req.model_path).expanduser()
    from agents.doors import path_problem

    if problem := path_problem(req.model_path, req.out_dir):  # a service's request: its roots, whatever door
        # the failure's bundle goes under the home, never to the output folder that was refused
        return {"request": req.model_copy(update={"out_dir": None}).model_dump(), "status": "failed",
                "started_at": started, "reason": f"refused: {problem}",
                "trace": [step("planner", f"refused: {problem}")]}
    if not path.exists():
        return {"request": req.model_dump(), "status": "failed", "started_at": started,
                "reason": f"model path {req.model_path} does not exist",
                "trace": [step("planner", f"model path {req.model_path} does not exist")]}
    if not path.is_dir():
        return {"request": req.model_dump(), "status": "failed", "started_at": started,
                "reason": f"model path {req.model_path} is not a folder",
                "trace": [step("planner", f"model path {req.model_path} is not a folder")]}
    from sandbox.isolation.parse_guard import source_problem

    # Before any agent parses the model in this process (the environment's imports, the scan, the entry):
    # a file that crashes or stalls the parser is found in a child with limits, and the port refused.
    if problem := source_problem(path):
        return {"request": req.model_dump(), "status": "failed", "started_at": started,
                "reason": f"untrusted source refused: {problem}",
                "trace": [step("planner", f"untrusted source refused: {problem}")]}
    req = req.model_copy(update={"model_path": str(path.resolve())})
    steps = plan_steps(req)
    plan: dict[str, Any] = {"steps": steps, "policy": req.policy, "source": source, "target": req.target,
                            "chip": req.chip,
            "objective": req.objective, "constraints": constraints,
            "budget": {"max_runs": req.max_runs, "max_wall_s": req.max_wall_s, "tune_trials": req.tune_trials}}
    if records:  # no workspace yet: the code-reader saves them under llm/ with the others
        plan["llm_records"] = records
    trace = [step("planner", llm_note, source=source, llm=True)] if llm_note else []
    trace.append(step("planner", f"plan ({'LLM' if source == 'llm' else 'rule parser'}): port {path.name} to "
                      f"{req.target} (chip {req.chip}), objective {req.objective}"
                      + (f", constraints {', '.join(constraints)}" if constraints else ""), steps=steps))
    return {
        "request": req.model_dump(),
        "plan": plan,
        "status": "running",
        "started_at": started_at_of(state) or started,
        "trace": trace,
    }
