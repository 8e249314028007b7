"""The port request: what the user asked for (PortRequest), parsed from goal text, and the plan of steps."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema, field_validator

from knowledge.errors import GoalError  # noqa: F401  (re-exported)
from sandbox.targets import canonical_chip, chip_names, get_target_spec, target_names


def _known_target(v: str) -> str:
    get_target_spec(v)  # TargetError (a ValueError) names the known ones
    return v


def _known_chip(v: str) -> str:
    if v not in chip_names():
        raise ValueError(f"unknown chip {v!r}; choose one of {', '.join(chip_names())}")
    return v


# Names come from the target registry (sandbox/targets/); the JSON schema still lists them (API, Studio).
TargetName = Annotated[str, AfterValidator(_known_target),
                       WithJsonSchema({"type": "string", "enum": list(target_names())})]
ChipName = Annotated[str, AfterValidator(_known_chip), WithJsonSchema({"type": "string", "enum": list(chip_names())})]


MAX_WALL_S = 48 * 3600.0  # a whole port
MAX_RUN_TIMEOUT_S = 6 * 3600.0  # one sandboxed run
MAX_TUNE_TIME_S = 24 * 3600.0


class PortRequest(BaseModel):
    """What the user asked for, typed. Built from CLI options, an API body, or goal text."""

    model_path: str
    target: TargetName = "auto"
    chip: ChipName = "910b"
    torch_npu: str = "2.13.0"
    objective: Literal["throughput", "latency", "correctness"] = "throughput"
    out_dir: str | None = None
    strict: bool = False
    policy: Literal["rule", "llm", "hybrid"] = "rule"
    shrink: bool = False
    """Run the manifest's ``shrink`` config overrides (quick runs on a small host), port and reference alike."""
    strict_perf: bool = False
    """Performance pathologies in the decode profile fail the port (agents/perf_evidence.py)."""
    tune: bool = False
    tune_trials: int | None = Field(default=None, ge=1, le=200)
    # Every number a client sends has a ceiling: the service runs what they ask for (1e12 s is forever).
    tune_time_s: float | None = Field(default=None, gt=0, le=MAX_TUNE_TIME_S)
    max_runs: int = Field(default=8, ge=1, le=100)
    max_wall_s: float = Field(default=1800.0, gt=0, le=MAX_WALL_S)
    run_timeout_s: float = Field(default=300.0, gt=0, le=MAX_RUN_TIMEOUT_S)

    @field_validator("model_path")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model_path is empty")
        return v


_CHIP = re.compile(r"\b(910\s*b\d?|910b\d?|a2|a3|310\s*p)\b", re.I)


_PATH = re.compile(r"(?:in|at|from|model)\s+(?:the\s+)?(?:folder\s+|directory\s+)?([~./\w-][\w./~-]*)", re.I)


_ASCEND_WORD = re.compile(r"\bascend\s+([\w-]+)", re.I)
_TARGET_WORD = re.compile(r"--target[=\s]+(\S+)|\btarget=(\S+)", re.I)
_TARGETS = ("cpu", "ascend-sim", "npu", "auto")


def goal_words_problem(goal: str) -> str | None:
    """A chip or target the goal names but npuport does not know ("Ascend 999X"), or None. A chip
    name is a word after "Ascend" with a digit in it; words like "NPUs" are not chip names."""
    for m in _ASCEND_WORD.finditer(goal):
        word = m.group(1)
        if any(ch.isdigit() for ch in word) and not _CHIP.match(goal, m.start(1)):
            return f"unknown chip 'Ascend {word}' in the goal; known: 910B (A2), A3, 310P"
    for m in _TARGET_WORD.finditer(goal):
        word = (m.group(1) or m.group(2)).rstrip(".,;:").lower()
        if word not in _TARGETS:
            return f"unknown target {word!r} in the goal; choose one of {', '.join(_TARGETS)}"
    return None


def parse_goal(goal: str, defaults: dict[str, Any] | None = None) -> PortRequest:
    """Understand a goal like "port the model in examples/ocr_mini to Ascend 910B and maximise
    throughput". Explicit fields in ``defaults`` win over what the text says."""
    text = goal.strip()
    if problem := goal_words_problem(text):
        raise GoalError(problem)
    fields: dict[str, Any] = {}
    for cand in _PATH.findall(text) + re.findall(r"(\S*/\S*)", text):
        cand = cand.rstrip(".,;:")
        if "/" in cand or Path(cand).expanduser().exists():
            fields["model_path"] = cand
            break
    if chip := _CHIP.search(text):
        c = re.sub(r"\s+", "", chip.group(1).lower())
        fields["chip"] = canonical_chip(c) or "910b"
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
