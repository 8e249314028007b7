"""planner: goal text -> PortRequest, and the plan of steps. Resolves the target once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agents.request import PortRequest, parse_goal, plan_steps
from agents.trace import step
from knowledge.errors import GoalError, first_line


def planner_node(state: dict[str, Any]) -> dict[str, Any]:
    """Turn the goal (text or structured request) into a PortRequest and a plan."""
    started = time.time()
    raw = dict(state.get("request") or {})
    goal = state.get("goal") or ""
    try:
        req = parse_goal(goal, raw) if goal else PortRequest(**raw)
    except (GoalError, ValueError) as exc:
        reason = first_line(exc)
        return {"status": "failed", "reason": f"cannot understand the goal: {reason}", "started_at": started,
                "trace": [step("planner", f"goal not understood: {reason}")]}
    path = Path(req.model_path).expanduser()
    if not path.exists():
        return {"request": req.model_dump(), "status": "failed", "started_at": started,
                "reason": f"model path {req.model_path} does not exist",
                "trace": [step("planner", f"model path {req.model_path} does not exist")]}
    if not path.is_dir():
        return {"request": req.model_dump(), "status": "failed", "started_at": started,
                "reason": f"model path {req.model_path} is not a folder",
                "trace": [step("planner", f"model path {req.model_path} is not a folder")]}
    req = req.model_copy(update={"model_path": str(path.resolve())})
    steps = plan_steps(req)
    return {
        "request": req.model_dump(),
        "plan": {"steps": steps, "policy": req.policy},
        "status": "running",
        "started_at": state.get("started_at") or started,
        "trace": [step("planner", f"plan: port {path.name} to {req.target} (chip {req.chip}), objective {req.objective}",
                       steps=steps)],
    }
