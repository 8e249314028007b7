"""The planner's question: which port request the user's goal text asks for (only what it states)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from agents.llm.client import LLMClient, Role
from agents.request import ChipName, TargetName


class GoalAnswer(BaseModel):
    """The port request the user's goal asks for; null for what the goal does not say."""

    model_path: str | None = None
    target: TargetName | None = None
    chip: ChipName | None = None
    objective: Literal["throughput", "latency", "correctness"] | None = None
    tune: bool | None = None
    constraints: list[str] = Field(default_factory=list,
                                   description="what must hold, as key=value, e.g. 'dtype=bf16', 'max_batch=8'")
    max_wall_s: float | None = Field(default=None, gt=0, description="time budget of the port, seconds")
    tune_trials: int | None = Field(default=None, ge=1, le=200, description="tuning trials budget")


ROLE = Role("planner", GoalAnswer, tools=False)


def check(goal: str):  # type: ignore[no-untyped-def]
    """A model path must appear in the goal, so the model cannot invent one."""
    def problems(ans: GoalAnswer) -> list[str]:
        if ans.model_path and ans.model_path not in goal:
            return [f"{ans.model_path!r} is not in the goal; copy the path exactly or give null"]
        return []

    return problems


def understand_goal(client: LLMClient, goal: str) -> dict[str, Any]:
    """The request fields a goal text asks for (only those it states)."""
    ans = client.ask(ROLE, f"Goal: {goal}", check(goal))
    out = ans.model_dump(exclude_none=True)
    if not out.get("constraints"):
        out.pop("constraints", None)
    return out
