"""Where the planner, code-reader and tuner ask the LLM: only with the ``llm`` or ``hybrid`` policy AND
a configured endpoint (NPUPORT_LLM_*). Each helper asks its role (agents/llm/roles/) through the one
client and returns what the LLM added plus a note for the trace; on any failure (service down,
timeout, 429 after retries, malformed answers, spent budget) it returns nothing and the note says the
rules decided and why, so the node carries on with its rules. Langchain is imported only when an
endpoint is configured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.llm.client import LLMClient
from agents.llm.roles import code_reader, planner, tuner
from agents.models import Finding
from agents.reasoning import think, why_failed
from agents.request import LLM_POLICIES
from knowledge.settings import LLMSettings


def llm_enabled(policy: str | None, settings: LLMSettings | None = None) -> bool:
    return (policy or "rule") in LLM_POLICIES and (settings or LLMSettings()).configured


def plan_goal(goal: str) -> tuple[dict[str, Any] | None, str, list[dict[str, Any]]]:
    """planner: the request fields and constraints the goal asks for, from the LLM (structured output),
    or None (the rule parser decides). Returns (fields, note, records)."""
    client = LLMClient()
    try:
        fields = planner.understand_goal(client, goal)
    except Exception as exc:  # noqa: BLE001 - the rule parser is the fallback
        note = f"the LLM planner failed ({why_failed(exc)}); the rule parser read the goal"
        think("planner", "rules", note)
        return None, note, client.records
    read = f"the LLM read the goal ({client.budget.used} tokens, prompt {client.last_prompt_id})"
    return fields, read, client.records


def review_code(workdir: Path | None, findings: list[Finding], only_unclassified: bool = False
                ) -> tuple[list[Finding], str]:
    """code_reader: findings the rules could not classify, from the LLM, each at a real file:line with
    a proposed hazard class. Returns (new findings, note). ``only_unclassified`` (the hybrid policy):
    ask only when some CUDA-looking line is left that no rule classified."""
    model_dir = workdir / "model" if workdir else None
    if model_dir is None or not model_dir.is_dir():
        return [], "no workspace to review"
    sites = code_reader.unclassified_sites(model_dir, findings)
    if only_unclassified and not sites:
        return [], "every CUDA-looking line is classified by a rule; the LLM code review is not needed"
    client = LLMClient(workdir=workdir)
    try:
        extra = code_reader.review_findings(client, findings, sites)
    except Exception as exc:  # noqa: BLE001 - the static findings stand on their own
        note = f"the LLM code review failed ({why_failed(exc)}); the rule findings stand"
        think("code_reader", "rules", note)
        return [], note
    return extra, (f"the LLM reviewed {len(sites)} unclassified site(s) and proposed {len(extra)} finding(s) "
                   f"(prompt {client.last_prompt_id})")


def propose_trials(workdir: Path | None, space: dict[str, list[Any]], tried: list[dict[str, Any]],
                   objective: str, n: int = 4) -> tuple[list[dict[str, Any]], str]:
    """tuner: configurations the LLM proposes inside the space (anything outside it is rejected by
    the role's check and sent back); the optimiser still measures and judges them."""
    client = LLMClient(workdir=workdir)
    try:
        trials = tuner.suggest_trials(client, space, tried, objective, n=n)
    except Exception as exc:  # noqa: BLE001 - the optimiser goes on alone
        note = f"the LLM tuner failed ({why_failed(exc)}); the optimiser searches alone"
        think("tuner", "rules", note)
        return [], note
    return trials, f"the LLM proposed {len(trials)} trial(s) (prompt {client.last_prompt_id})"
