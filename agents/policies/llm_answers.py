"""What the LLM policy asks for and counts: the pydantic answers each agent's question expects, and the
token budget of a port."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from agents.llm_edits import SearchReplace
from agents.models import HazardCategory, Severity
from agents.request import ChipName, TargetName
from knowledge.errors import BudgetExhausted

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage, BaseMessage


# ------------------------------------------------------------------------------------------- answers


class FixProposal(BaseModel):
    """The fix: an existing codemod (name it, with its params and file) OR an edit (search/replace
    blocks or a unified diff)."""

    codemod: str | None = Field(default=None, description="name of an existing codemod, or null for an edit")
    codemod_params: dict[str, Any] = Field(default_factory=dict, description="e.g. {'line': 12} for align-devices")
    file: str | None = Field(default=None, description="the file the codemod rewrites")
    edits: list[SearchReplace] = Field(default_factory=list)
    diff: str | None = Field(default=None, description="a unified diff, instead of or besides edits")


class DiagnosisAnswer(BaseModel):
    """Your diagnosis of the failed run and the fix to make (fix null when you know none)."""

    kind: str = Field(description="short failure class, e.g. 'unsupported-layout', 'npu-dtype'")
    summary: str = Field(description="one or two sentences: what fails, where, and why")
    file: str | None = Field(default=None, description="model file of the cause, relative to the model root")
    line: int | None = None
    fix: FixProposal | None = None
    citations: list[str] = Field(default_factory=list, description="cites from search_kb, e.g. 'recipe:H5'")


class PlannedFix(BaseModel):
    """One patch: a codemod over the findings it fixes, or an edit for findings no codemod fixes."""

    codemod: str | None = Field(default=None, description="an existing codemod's name, or null for an edit")
    finding_ids: list[str] = Field(default_factory=list)
    summary: str = ""
    edits: list[SearchReplace] = Field(default_factory=list)
    diff: str | None = None


class FixPlan(BaseModel):
    """The patches to make before the first run, in the order to apply them."""

    fixes: list[PlannedFix] = Field(default_factory=list)


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


class ReviewedFinding(BaseModel):
    hazard: str = Field(description="a hazard class id from the system prompt's list, e.g. 'H1'")
    rule: str = Field(description="short machine name, e.g. 'layout-assumption'")
    file: str
    line: int
    message: str
    category: HazardCategory
    severity: Severity


class ReviewAnswer(BaseModel):
    """Hazards the static scan missed (an empty list when there are none)."""

    findings: list[ReviewedFinding] = Field(default_factory=list)


class TrialsAnswer(BaseModel):
    """Configurations to try next, each a dict of parameter -> value from the search space."""

    trials: list[dict[str, Any]] = Field(default_factory=list)


# -------------------------------------------------------------------------------------------- budget


class TokenBudget:
    """Tokens spent by the LLM on one port. With a ledger file (in the workspace) the count survives
    across graph nodes, each of which builds a fresh policy, and across resumes."""

    def __init__(self, limit: int, ledger: Path | None = None) -> None:
        self.limit = limit
        self.ledger = ledger
        self._used = 0
        if ledger and ledger.is_file():
            try:
                self._used = int(json.loads(ledger.read_text()).get("tokens", 0))
            except (ValueError, AttributeError):
                self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def exhausted(self) -> bool:
        return self._used >= self.limit

    def add(self, tokens: int) -> None:
        self._used += max(0, tokens)
        if self.ledger and self.ledger.parent.is_dir():
            self.ledger.write_text(json.dumps({"tokens": self._used, "limit": self.limit}))

    def check(self) -> None:
        if self.exhausted:
            raise BudgetExhausted(f"the LLM token budget of {self.limit} tokens is spent ({self._used} used)")


def tokens_of(ai: AIMessage, sent: Sequence[BaseMessage]) -> int:
    """Tokens of one exchange from the response's usage; a character estimate when the server sends none."""
    usage = ai.usage_metadata
    if usage and usage.get("total_tokens"):
        return int(usage["total_tokens"])
    chars = sum(len(str(m.content)) for m in sent) + len(str(ai.content)) + len(json.dumps(ai.tool_calls, default=str))
    return chars // 4 + 1


