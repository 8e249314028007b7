"""The patcher's question: the patches to make before the first run, from the static findings (an
existing codemod over the findings it fixes, or an edit for findings no codemod fixes)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from agents.fixing.llm_edits import SearchReplace
from agents.llm.client import LLMClient, Role
from agents.llm.roles.fixes import catalogue_text, check_fix
from agents.models import Finding


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


ROLE = Role("patcher", FixPlan)


def check(known: set[str], model_dir: Path | None):  # type: ignore[no-untyped-def]
    """Every fix names findings of the scan; codemods exist; edits apply and parse."""
    def problems(plan: FixPlan) -> list[str]:
        out = []
        for i, fx in enumerate(plan.fixes, 1):
            unknown = [fid for fid in fx.finding_ids if fid not in known]
            if unknown:
                out.append(f"fix {i}: unknown finding ids {unknown}")
            if fx.codemod and not fx.finding_ids:
                out.append(f"fix {i}: a codemod fix must name the findings it fixes")
            out += [f"fix {i}: {p}" for p in check_fix(fx.codemod, fx.edits, fx.diff, model_dir)]
        return out

    return problems


def question(findings: list[Finding]) -> str:
    table = "\n".join(f"- {f.id}: {f.hazard}/{f.rule} at {f.file}:{f.line} [{f.category}, {f.severity}, "
                      f"{'codemod exists' if f.fixable else 'no codemod'}] {f.message} | {f.snippet[:120]}"
                      for f in findings)
    return (f"Findings of the static scan:\n{table}\n\nCodemods:\n{catalogue_text()}\n\n"
            "Plan the patches to make before the first run.")


def plan(client: LLMClient, findings: list[Finding]) -> FixPlan:
    return client.ask(ROLE, question(findings), check({f.id for f in findings}, client.toolbox.model_dir))
