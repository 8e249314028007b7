"""The tuner's question: configurations to try next, every value from the search space (the optimiser
still measures and judges them)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from agents.llm.client import LLMClient, Role


class TrialsAnswer(BaseModel):
    """Configurations to try next, each a dict of parameter -> value from the search space."""

    trials: list[dict[str, Any]] = Field(default_factory=list)


ROLE = Role("tuner", TrialsAnswer, tools=False)


def check(space: dict[str, list[Any]]):  # type: ignore[no-untyped-def]
    def problems(ans: TrialsAnswer) -> list[str]:
        out = []
        for i, t in enumerate(ans.trials, 1):
            for k, v in t.items():
                if k not in space:
                    out.append(f"trial {i}: {k!r} is not a parameter; parameters: {', '.join(space)}")
                elif v not in space[k]:
                    out.append(f"trial {i}: {k}={v!r} is not one of {space[k]}")
        return out

    return problems


def suggest_trials(client: LLMClient, space: dict[str, list[Any]], tried: list[dict[str, Any]], objective: str,
                   n: int = 4) -> list[dict[str, Any]]:
    """Up to ``n`` untried configurations, every value taken from the search space."""
    done = "\n".join(f"- {json.dumps(t, default=str)}" for t in tried) or "none"
    ans = client.ask(ROLE, f"Objective: {objective}\nSearch space: {json.dumps(space, default=str)}\n"
                           f"Tried so far:\n{done}\n\nPropose up to {n} configurations to try next.", check(space))
    fresh: list[dict[str, Any]] = []
    for t in ans.trials:
        if t not in tried and t not in fresh:
            fresh.append(t)
    return fresh[:n]
