"""The port request: what the user asked for (PortRequest), parsed from goal text, and the plan of steps."""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, Field, WithJsonSchema, field_validator

from knowledge.errors import GoalError
from sandbox.targets import (
    CHIP_REGISTRY,
    DEFAULT_CHIP,
    DEFAULT_TARGET,
    DEFAULT_TORCH_NPU,
    REFERENCE_TARGET,
    TARGETS,
    canonical_chip,
    chip_names,
    get_chip,
    get_target_spec,
    target_names,
)


def _known_target(v: str) -> str:
    get_target_spec(v)  # TargetError (a ValueError) names the known ones
    return v


def _known_chip(v: str) -> str:
    return get_chip(v).key  # the one chip resolver: an alias reads as its chip; TargetError names the known ones


@functools.lru_cache(maxsize=1)
def _torch_npu_releases() -> frozenset[str]:
    """The torch_npu rows of agents/data/compat.yaml (read here, not through agents.environment, which reads
    requests)."""
    compat = yaml.safe_load((Path(__file__).resolve().parent / "data" / "compat.yaml").read_text())
    return frozenset(compat["torch_npu"])


def known_torch_npu(v: str) -> str:
    """A torch_npu release of the compatibility table (agents/data/compat.yaml), exactly: the server builds
    an op matrix from that release's wheel (knowledge/op_matrix.py), so no other string reaches a download."""
    if v not in _torch_npu_releases():
        raise ValueError(f"unknown torch_npu release {str(v)[:40]!r}: npuport ports to the releases of its "
                         "compatibility table (agents/data/compat.yaml), e.g. 2.13.0")
    return v


POLICIES: tuple[str, ...] = ("rule", "llm", "hybrid")
"""Every policy's name (agents/policies/ implements them; the first is the default): the CLI's
--policy, PortRequest, the service and the batch manifest read this list."""
LLM_POLICIES: tuple[str, ...] = ("llm", "hybrid")
"""The policies that ask the LLM (when an endpoint is configured)."""


def _known_policy(v: str) -> str:
    if v not in POLICIES:
        raise ValueError(f"unknown policy {v!r}; choose one of {', '.join(POLICIES)}")
    return v


# Names come from the target registry (sandbox/targets/); the JSON schema still lists them (API, Studio).
TargetName = Annotated[str, AfterValidator(_known_target),
                       WithJsonSchema({"type": "string", "enum": list(target_names())})]
ChipName = Annotated[str, AfterValidator(_known_chip), WithJsonSchema({"type": "string", "enum": list(chip_names())})]
TorchNpuVersion = Annotated[str, AfterValidator(known_torch_npu)]
PolicyName = Annotated[str, AfterValidator(_known_policy), WithJsonSchema({"type": "string", "enum": list(POLICIES)})]


MAX_WALL_S = 48 * 3600.0  # a whole port
MAX_RUN_TIMEOUT_S = 6 * 3600.0  # one sandboxed run
MAX_TUNE_TIME_S = 24 * 3600.0


class PortRequest(BaseModel):
    """What the user asked for, typed: the one schema of a request. Every door derives its fields from
    it (``request_fields``): the CLI's options (api/cli_options.py), the API body (api/routers/ports.py),
    Studio's form (graph/state.py ``PortInput``) and the batch manifest (graph/batch/manifest.py); goal
    text fills what a door left out (``parse_goal``). A new request field is one line here
    (tests/test_request_doors.py holds it)."""

    model_path: str = Field(description="the model folder (never written)")
    target: TargetName = Field(
        DEFAULT_TARGET, description="where the port runs: a real NPU, the emulator, or the CPU")
    chip: ChipName = Field(DEFAULT_CHIP, description="the Ascend chip")
    torch_npu: TorchNpuVersion = Field(DEFAULT_TORCH_NPU, description="torch_npu version to emulate")
    objective: Literal["throughput", "latency", "correctness"] = Field(
        "throughput", description="what the tuner optimises")
    out_dir: str | None = Field(None, description="bundle folder")
    strict: bool = Field(False, description="fail on CPU fallbacks (TORCH_NPU_FALLBACK_CPU_DISABLE=1)")
    policy: PolicyName = Field(
        POLICIES[0], description="rule (offline, default) | llm | hybrid (rules first, then the LLM; set "
                                 "NPUPORT_LLM_*)")
    shrink: bool = Field(
        False, description="quick runs on a small config derived from config.json (random weights; the "
                           "manifest's `shrink:` overrides win), port and reference alike")
    strict_perf: bool = Field(
        False, description="fail the port on performance pathologies in its decode profile (no KV cache, "
                           "per-step syncs, ...)")
    tune: bool = Field(False, description="benchmark and tune the validated port (minutes on a small host)")
    serve: bool | None = Field(
        None, description="exercise the deployment after the bundle is written: vLLM serves the "
                          "validated port with serve.sh, tokens checked, throughput probed (default: "
                          "NPUPORT_SERVE, on; `npuport deploy BUNDLE` runs it later)")
    bench: bool = Field(
        False, description="the deployment's full side-by-side throughput comparison (vLLM at concurrency "
                           "1, 8, 32 against Transformers one at a time and batched) instead of the probe")
    # Every number a client sends has a ceiling: the service runs what they ask for (1e12 s is forever).
    tune_trials: int | None = Field(
        None, ge=1, le=200, description="budget: tuning trials (default: NPUPORT_TUNE_TRIALS, else 12)")
    tune_time_s: float | None = Field(
        None, gt=0, le=MAX_TUNE_TIME_S, description="budget: tuning seconds (default: half the wall budget)")
    max_runs: int = Field(8, ge=1, le=100, description="budget: sandbox runs of the port")
    max_wall_s: float = Field(1800.0, gt=0, le=MAX_WALL_S, description="budget: wall time in seconds")
    run_timeout_s: float = Field(
        300.0, gt=0, le=MAX_RUN_TIMEOUT_S,
        description="wall-clock limit of one sandbox run, seconds; raised to 3x the longest run that "
                    "finished (a slow host's reference gets the time its port took)")

    @field_validator("model_path")
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("model_path is empty")
        return v


def fields_of(model: type[BaseModel], *, only: Collection[str] | None = None, exclude: Collection[str] = (),
              partial: bool = False) -> dict[str, Any]:
    """``model``'s fields (those in ``only``, less ``exclude``) as ``pydantic.create_model`` definitions:
    each one's type, bounds, default and description as ``model`` declares them. ``partial``: every
    field optional, None when not given (the door's defaults, the goal or the model's own fill it)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if (only is not None and name not in only) or name in exclude:
            continue
        typ: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        if partial:
            out[name] = (typ | None, Field(None, description=info.description))
        elif info.default_factory is not None:
            out[name] = (typ, Field(default_factory=info.default_factory, description=info.description))
        else:
            out[name] = (typ, Field(info.default, description=info.description))
    return out


def request_fields(*, only: Collection[str] | None = None, exclude: Collection[str] = (),
                   partial: bool = False) -> dict[str, Any]:
    """PortRequest's fields as a door takes them (``fields_of``): the one place they are declared."""
    return fields_of(PortRequest, only=only, exclude=exclude, partial=partial)


def _chip_pattern() -> re.Pattern[str]:
    """Every chip key and alias of the registry, with optional spaces after the digits ("910 B"); made
    at each call, like the target names, so the registry is the only list."""
    names = sorted({n for c in CHIP_REGISTRY.values() for n in (c.key, *c.aliases)}, key=len, reverse=True)
    spaced = [re.sub(r"(?<=\d)(?=[a-z])", r"\\s*", re.escape(n)) for n in names]
    return re.compile(rf"\b({'|'.join(spaced)})\b", re.I)


_PATH = re.compile(r"(?:in|at|from|model)\s+(?:the\s+)?(?:folder\s+|directory\s+)?([~./\w-][\w./~-]*)", re.I)


_ASCEND_WORD = re.compile(r"\bascend\s+([\w-]+)", re.I)
_TARGET_WORD = re.compile(r"--target[=\s]+(\S+)|\btarget=(\S+)", re.I)


def goal_words_problem(goal: str) -> str | None:
    """A chip or target the goal names but npuport does not know ("Ascend 999X"), or None. A chip
    name is a word after "Ascend" with a digit in it; words like "NPUs" are not chip names."""
    for m in _ASCEND_WORD.finditer(goal):
        word = m.group(1)
        if any(ch.isdigit() for ch in word) and not _chip_pattern().match(goal, m.start(1)):
            known = ", ".join(f"{c.key.upper()}{f' ({c.aliases[0].upper()})' if c.aliases else ''}"
                              for c in CHIP_REGISTRY.values())
            return f"unknown chip 'Ascend {word}' in the goal; known: {known}"
    for m in _TARGET_WORD.finditer(goal):
        word = (m.group(1) or m.group(2)).rstrip(".,;:").lower()
        if word not in target_names():
            return f"unknown target {word!r} in the goal; choose one of {', '.join(target_names())}"
    return None


def _target_in_goal(lowered: str) -> str | None:
    """The target a goal names: ``--target X`` / ``target=X``, "on the <reference target>" (the host
    CPU), or an emulated target by its name or the word "emulate"."""
    if m := _TARGET_WORD.search(lowered):
        return (m.group(1) or m.group(2)).rstrip(".,;:")
    if re.search(rf"\bon (the )?{re.escape(REFERENCE_TARGET)}\b", lowered):
        return REFERENCE_TARGET
    emulated = [n for n, s in TARGETS.items() if s.emulated]
    if emulated and ("emulat" in lowered or any(n in lowered for n in emulated)):
        return emulated[0]
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
    if chip := _chip_pattern().search(text):
        c = re.sub(r"\s+", "", chip.group(1).lower())
        fields["chip"] = canonical_chip(c) or DEFAULT_CHIP
    lowered = text.lower()
    if "latency" in lowered:
        fields["objective"] = "latency"
    elif "throughput" in lowered or "fast" in lowered:
        fields["objective"] = "throughput"
    if target := _target_in_goal(lowered):
        fields["target"] = target
    if "tune" in lowered or "maximi" in lowered:
        fields["tune"] = True
    fields.update({k: v for k, v in (defaults or {}).items() if v is not None})
    if "model_path" not in fields:
        raise GoalError("the goal names no model folder; say e.g. 'port the model in ./my_model to Ascend 910B'")
    return PortRequest(**fields)


def plan_steps(req: PortRequest) -> list[str]:
    from agents.rules.registry import active as active_rules  # libcst: only when a plan is made

    steps = [
        f"copy {req.model_path} into a git workspace (the original is never written)",
        f"scan the source for hazards {active_rules().span()} and find the model's entry",
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


def request_of(source: Mapping[str, Any] | PortRequest | None) -> PortRequest:
    """The typed request of a state, a report or a job (their ``request``), or of a request dict: the
    one reader of it, so every node and skill sees the same fields with the same defaults. A recorded
    request that no longer validates (a report from an older npuport, a failed planner's raw input)
    reads leniently: its fields over the defaults, unchecked."""
    if isinstance(source, PortRequest):
        return source
    src: Mapping[str, Any] = source or {}
    # a state or report holds the request under "request"; a request dict names a model or has only
    # request fields (a state without a request yet has neither)
    is_request = "model_path" in src or set(src) <= set(PortRequest.model_fields)
    raw: Any = src.get("request") if "request" in src else src if is_request else {}
    if isinstance(raw, PortRequest):
        return raw
    raw = dict(raw or {})
    try:
        return PortRequest.model_validate(raw)
    except ValueError:
        known = {k: v for k, v in raw.items() if k in PortRequest.model_fields}
        defaults = {k: f.get_default(call_default_factory=True) for k, f in PortRequest.model_fields.items()
                    if not f.is_required()}
        return PortRequest.model_construct(**{**defaults, "model_path": "", **known})
