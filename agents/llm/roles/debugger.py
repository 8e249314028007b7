"""The debugger's question: the cause of a failed run and the fix to make. The model's exception text is
fenced off as data (agents/llm/fence.py); the question carries npuport's own classification, the
changes made so far and the knowledge base's passages to cite."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from agents.llm.client import LLMClient, Role
from agents.llm.fence import FENCE_NOTE, fence
from agents.llm.roles.fixes import FixProposal, catalogue_text, check_fix
from agents.models import Diagnosis, StructuredException


class DiagnosisAnswer(BaseModel):
    """Your diagnosis of the failed run and the fix to make (fix null when you know none)."""

    kind: str = Field(description="short failure class, e.g. 'unsupported-layout', 'npu-dtype'")
    summary: str = Field(description="one or two sentences: what fails, where, and why")
    file: str | None = Field(default=None, description="model file of the cause, relative to the model root")
    line: int | None = None
    fix: FixProposal | None = None
    citations: list[str] = Field(default_factory=list, description="cites from search_kb, e.g. 'recipe:H5'")


ROLE = Role("debugger", DiagnosisAnswer)


def exception_text(exc: StructuredException) -> str:
    frames = "\n".join(f"  {'[model] ' if f.in_model else ''}{f.file}:{f.line} in {f.func}: {f.code}"
                       for f in exc.frames[-12:])
    return fence(f"{exc.type}: {exc.message[:2000]}\nframes (innermost last):\n{frames or '  (none)'}", "exception")


def changed_lines(workdir: Path | None, limit: int = 4000) -> str:
    """What npuport changed so far (git diff from the original), so the model sees its own edits."""
    if workdir is None:
        return ""
    from agents.workspace import Workspace

    try:
        diff = Workspace(workdir).diff_from_original()
    except Exception:  # noqa: BLE001 - no repository yet: nothing changed
        return ""
    if not diff.strip():
        return "Changes npuport made so far: none\n\n"
    cut = "\n... (diff truncated)" if len(diff) > limit else ""
    return f"Changes npuport made so far (git diff from the original):\n{diff[:limit]}{cut}\n\n"


def kb_passages(exception: StructuredException) -> str:
    """The knowledge base's top passages for the exception, each with its id to cite."""
    from agents.reading.citations import kb_citations

    try:
        hits = kb_citations(f"{exception.type}: {exception.message[:300]}", k=3)
    except Exception:  # noqa: BLE001 - no usable knowledge base: the search_kb tool says so
        hits = []
    if not hits:
        return ""
    body = "\n".join(f"- [{c.source}] {c.title}: {c.excerpt}" for c in hits)
    return f"Knowledge-base passages (cite by the id in brackets):\n{body}\n\n"


def question(client: LLMClient, run_id: str, exception: StructuredException, history: list[Diagnosis],
             kind: str, key: str, summary: str, rule_summary: str | None) -> str:
    earlier = "\n".join(f"- {d.id}: {d.signature}: {d.summary} (fix: {d.fix}"
                        + (f", edits {json.dumps(d.params.get('edits'))[:600]}" if d.params.get("edits") else "")
                        + ")" for d in history[-6:]) or "none"
    return (f"Run {run_id} of the port failed.\n{FENCE_NOTE}\n\n{exception_text(exception)}\n\n"
            f"npuport's classifier: {kind} ({key}): {summary}\n"
            + (f"The offline rules say: {rule_summary}\n" if rule_summary else "")
            + f"\nEarlier diagnoses of this port:\n{earlier}\n\n"
            + changed_lines(client.workdir) + kb_passages(exception)
            + f"Codemods:\n{catalogue_text()}\n\n"
            "Find the cause in the model's files and propose a fix; cite passages by their id.")


def check(model_dir: Path | None, fallback_file: str | None):  # type: ignore[no-untyped-def]
    """A proposed fix must apply: the codemod changes the named file, or the edit applies and parses."""
    def problems(ans: DiagnosisAnswer) -> list[str]:
        fx = ans.fix
        if fx is None:
            return []
        return check_fix(fx.codemod, fx.edits, fx.diff, model_dir, file=fx.file or ans.file or fallback_file,
                         params=fx.codemod_params, dry_run=True)

    return problems


def diagnose(client: LLMClient, run_id: str, exception: StructuredException, history: list[Diagnosis],
             base: Diagnosis, rule_summary: str | None) -> DiagnosisAnswer:
    q = question(client, run_id, exception, history, base.kind, base.signature, base.summary, rule_summary)
    return client.ask(ROLE, q, check(client.toolbox.model_dir, base.file))
