"""The policy interface shared by the rule (offline) policy and the LLM policy.

A policy decides; skills (scanner, codemods, sandbox) act. Both policies return the same typed
records, so the graph does not care which one is in charge.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from agents.models import Citation, Diagnosis, Finding, StructuredException


class FixAction(BaseModel):
    """One patch to make: a codemod over some files (one commit)."""

    codemod: str
    files: list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    finding_ids: list[str] = Field(default_factory=list)
    diagnosis_id: str | None = None
    summary: str
    citations: list[Citation] = Field(default_factory=list)


class Policy(Protocol):
    name: str

    def plan_fixes(self, findings: list[Finding]) -> list[FixAction]:
        """Patches to make before the first run, from the static findings."""
        ...

    def diagnose(self, run_id: str, exception: StructuredException, history: list[Diagnosis]) -> Diagnosis:
        """Classify a failed run and name the fix, or no fix."""
        ...

    def fix_for(self, diagnosis: Diagnosis) -> FixAction | None:
        ...
