"""Where the planner, code-reader and tuner ask the LLM: only with the ``llm`` or ``hybrid`` policy AND
a configured endpoint (NPUPORT_LLM_*). Each helper returns what the LLM added plus a note for the
trace; on any failure (service down, timeout, 429 after retries, malformed answers, spent budget) it
returns nothing and the note says the rules decided and why, so the node carries on with its rules.
Langchain is imported only when an endpoint is configured."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agents.models import Finding
from agents.policies import LLM_POLICIES, get_policy
from agents.policies.base import PolicyContext
from agents.policies.reasoning import think, why_failed
from knowledge.settings import LLMSettings


def llm_enabled(policy: str | None, settings: LLMSettings | None = None) -> bool:
    return (policy or "rule") in LLM_POLICIES and (settings or LLMSettings()).configured


def _policy(context: PolicyContext | None) -> Any:
    # the same door as the patcher's and the debugger's: get_policy (the LLM policy's client, budget, records)
    return get_policy(LLM_POLICIES[0], context)


def save_records(workdir: Path, records: list[dict[str, Any]]) -> None:
    """Write exchanges made before the workspace existed (the planner's) under <workdir>/llm/."""
    import json

    folder = workdir / "llm"
    folder.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (folder / f"{rec['id']}.json").write_text(json.dumps(rec, indent=1, default=str), encoding="utf-8")


def plan_goal(goal: str) -> tuple[dict[str, Any] | None, str, list[dict[str, Any]]]:
    """planner: the request fields and constraints the goal asks for, from the LLM (structured output),
    or None (the rule parser decides). Returns (fields, note, records)."""
    pol = _policy(None)
    try:
        fields = pol.understand_goal(goal)
    except Exception as exc:  # noqa: BLE001 - the rule parser is the fallback
        note = f"the LLM planner failed ({why_failed(exc)}); the rule parser read the goal"
        think("planner", "rules", note)
        return None, note, pol.records
    return fields, f"the LLM read the goal ({pol.budget.used} tokens, prompt {pol.last_prompt_id})", pol.records


# Calls and imports that look CUDA-specific but that no rule classifies: custom extensions, kernels,
# device plumbing. Their lines (with context) go to the LLM code-reader.
_CUDAISH = re.compile(r"(cuda|cupy|triton|cpp_extension|load_inline|nvrtc|cublas|cudnn|nccl|\._C\b|\.cu\b|"
                      r"custom_op|autograd\.Function|__cuda_array_interface__|get_device_capability|\bapex\b)", re.I)


def unclassified_sites(model_dir: Path, findings: list[Finding], limit: int = 30) -> list[dict[str, Any]]:
    """CUDA-looking lines that no finding covers, with three lines of context each side."""
    covered = {(f.file, f.line) for f in findings}
    out: list[dict[str, Any]] = []
    for path in sorted(model_dir.rglob("*.py")):
        if ".git" in path.parts:
            continue
        rel = path.relative_to(model_dir).as_posix()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for i, line in enumerate(lines, 1):
            if line.lstrip().startswith("#") or (rel, i) in covered or not _CUDAISH.search(line):
                continue
            lo, hi = max(1, i - 3), min(len(lines), i + 3)
            ctx = "\n".join(f"{n:5d}| {lines[n - 1]}" for n in range(lo, hi + 1))
            out.append({"file": rel, "line": i, "code": line.strip()[:200], "context": ctx})
            if len(out) >= limit:
                return out
    return out


def review_code(context: PolicyContext, findings: list[Finding], only_unclassified: bool = False
                ) -> tuple[list[Finding], str]:
    """code_reader: findings the rules could not classify, from the LLM, each at a real file:line with
    a proposed hazard class. Returns (new findings, note). ``only_unclassified`` (the hybrid policy):
    ask only when some CUDA-looking line is left that no rule classified."""
    model_dir = context.model_dir
    if model_dir is None or not model_dir.is_dir():
        return [], "no workspace to review"
    sites = unclassified_sites(model_dir, findings)
    if only_unclassified and not sites:
        return [], "every CUDA-looking line is classified by a rule; the LLM code review is not needed"
    pol = _policy(context)
    try:
        extra = pol.review_findings(findings, sites)
    except Exception as exc:  # noqa: BLE001 - the static findings stand on their own
        note = f"the LLM code review failed ({why_failed(exc)}); the rule findings stand"
        think("code_reader", "rules", note)
        return [], note
    return extra, (f"the LLM reviewed {len(sites)} unclassified site(s) and proposed {len(extra)} finding(s) "
                   f"(prompt {pol.last_prompt_id})")


def propose_trials(context: PolicyContext, space: dict[str, list[Any]], tried: list[dict[str, Any]],
                   objective: str, n: int = 4) -> tuple[list[dict[str, Any]], str]:
    """tuner: configurations the LLM proposes inside the space (anything outside it is rejected by
    the policy's check and sent back); the optimiser still measures and judges them."""
    pol = _policy(context)
    try:
        trials = pol.suggest_trials(space, tried, objective, n=n)
    except Exception as exc:  # noqa: BLE001 - the optimiser goes on alone
        note = f"the LLM tuner failed ({why_failed(exc)}); the optimiser searches alone"
        think("tuner", "rules", note)
        return [], note
    return trials, f"the LLM proposed {len(trials)} trial(s) (prompt {pol.last_prompt_id})"
