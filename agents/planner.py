"""planner: goal text -> PortRequest, and the plan of steps. Resolves the target once."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from agents.trace import step

TargetName = Literal["cpu", "ascend-sim", "npu", "auto"]


class PortRequest(BaseModel):
    """What the user asked for, typed. Built from CLI options, an API body, or goal text."""

    model_path: str
    target: TargetName = "auto"
    chip: Literal["910b", "a3", "310p"] = "910b"
    torch_npu: str = "2.13.0"
    objective: Literal["throughput", "latency", "correctness"] = "throughput"
    out_dir: str | None = None
    strict: bool = False
    strict_perf: bool = False
    """Performance pathologies in the decode profile fail the port (agents/perf_evidence.py)."""
    policy: str = "rule"
    tune: bool = False
    tune_trials: int | None = Field(default=None, ge=1, le=200)
    tune_time_s: float | None = Field(default=None, gt=0)
    max_runs: int = Field(default=8, ge=1, le=100)
    max_wall_s: float = Field(default=1800.0, gt=0)
    run_timeout_s: float = Field(default=300.0, gt=0)

    @field_validator("model_path")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model_path is empty")
        return v


class GoalError(ValueError):
    pass


_CHIP = re.compile(r"\b(910\s*b\d?|910b\d?|a2|a3|310\s*p)\b", re.I)
_PATH = re.compile(r"(?:in|at|from|model)\s+(?:the\s+)?(?:folder\s+|directory\s+)?([~./\w-][\w./~-]*)", re.I)


def parse_goal(goal: str, defaults: dict[str, Any] | None = None) -> PortRequest:
    """Understand a goal like "port the model in examples/ocr_mini to Ascend 910B and maximise
    throughput". Explicit fields in ``defaults`` win over what the text says."""
    text = goal.strip()
    fields: dict[str, Any] = {}
    for cand in _PATH.findall(text) + re.findall(r"(\S*/\S*)", text):
        cand = cand.rstrip(".,;:")
        if "/" in cand or Path(cand).expanduser().exists():
            fields["model_path"] = cand
            break
    if chip := _CHIP.search(text):
        c = re.sub(r"\s+", "", chip.group(1).lower())
        fields["chip"] = "310p" if c.startswith("310") else "a3" if c == "a3" else "910b"
    lowered = text.lower()
    if "latency" in lowered:
        fields["objective"] = "latency"
    elif "throughput" in lowered or "fast" in lowered:
        fields["objective"] = "throughput"
    if re.search(r"\bon (the )?cpu\b|--target cpu", lowered):
        fields["target"] = "cpu"
    elif "emulat" in lowered or "ascend-sim" in lowered:
        fields["target"] = "ascend-sim"
    if "tune" in lowered or "maximi" in lowered:
        fields["tune"] = True
    fields.update({k: v for k, v in (defaults or {}).items() if v is not None})
    if "model_path" not in fields:
        raise GoalError("the goal names no model folder; say e.g. 'port the model in ./my_model to Ascend 910B'")
    return PortRequest(**fields)


def plan_steps(req: PortRequest) -> list[str]:
    steps = [
        f"copy {req.model_path} into a git workspace (the original is never written)",
        "scan the source for hazards H1-H11 and find the model's entry",
        "apply recipes as codemods, one commit each",
        f"run the port on {req.target} in a sandbox; debug failures (at most {req.max_runs} runs)",
        "validate greedy tokens against the original's semantics on CPU float32",
    ]
    steps.append("benchmark and tune" if req.tune else "record timings (tuning not requested)")
    steps.append("write the bundle: port.patch, report, trace")
    return steps


def new_run_id(model_path: str) -> str:
    name = re.sub(r"[^\w-]", "_", Path(model_path).name or "model")[:40]
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def planner_node(state: dict[str, Any]) -> dict[str, Any]:
    """Turn the goal (text or structured request) into a PortRequest and a plan."""
    started = time.time()
    raw = dict(state.get("request") or {})
    goal = state.get("goal") or ""
    try:
        req = parse_goal(goal, raw) if goal else PortRequest(**raw)
    except (GoalError, ValueError) as exc:
        reason = str(exc).splitlines()[0]
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
