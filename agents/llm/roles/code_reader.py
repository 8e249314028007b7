"""The code reader's question: hazards the static scan missed, each at a real file:line of the model
with a hazard class of the registry. Also which CUDA-looking lines no rule classified (the sites the
question shows the LLM)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agents.fixing.llm_edits import resolve_in
from agents.llm.client import LLMClient, Role
from agents.models import Citation, Finding, HazardCategory, Severity
from agents.rules.registry import active as active_rules
from knowledge.errors import ToolError


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


ROLE = Role("code_reader", ReviewAnswer)

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


def check(model_dir: Path):  # type: ignore[no-untyped-def]
    """Every finding names a registered hazard class and a line that exists."""
    hazards = active_rules().hazards()

    def problems(ans: ReviewAnswer) -> list[str]:
        out = []
        for rf in ans.findings:
            if rf.hazard not in hazards:
                out.append(f"{rf.hazard!r} is not a hazard class; choose one of {', '.join(hazards)}")
            try:
                lines = resolve_in(model_dir, rf.file).read_text(encoding="utf-8").splitlines()
            except (ToolError, OSError) as exc:
                out.append(f"{rf.file}: {exc}")
                continue
            if not 1 <= rf.line <= len(lines):
                out.append(f"{rf.file} has no line {rf.line}")
        return out

    return problems


def question(findings: list[Finding], sites: list[dict[str, Any]] | None) -> str:
    table = "\n".join(f"- {f.hazard}/{f.rule} at {f.file}:{f.line}: {f.message}" for f in findings) or "none"
    unclassified = "\n\n".join(f"{x['file']}:{x['line']}: {x['code']}\n{x['context']}" for x in sites or [])
    return (f"The static scan found:\n{table}\n\n"
            + (f"Lines that look CUDA-specific but that no rule classified (custom extensions, kernels, "
               f"device logic), with context:\n{unclassified}\n\n" if unclassified else "")
            + "Review the model for what it missed: give each hazard its file:line and class.")


def review_findings(client: LLMClient, findings: list[Finding], sites: list[dict[str, Any]] | None = None
                    ) -> list[Finding]:
    """Hazards the static scan missed, each checked to point at a real line; none without a model."""
    model_dir = client.toolbox.model_dir
    if model_dir is None:
        return []
    ans = client.ask(ROLE, question(findings, sites), check(model_dir))
    seen = {(f.file, f.line, f.hazard) for f in findings}
    out = []
    for rf in ans.findings:
        if (rf.file, rf.line, rf.hazard) in seen:
            continue
        seen.add((rf.file, rf.line, rf.hazard))
        snippet = resolve_in(model_dir, rf.file).read_text(encoding="utf-8").splitlines()[rf.line - 1].strip()
        out.append(Finding(id=f"{rf.hazard}-{rf.file}-{rf.line}-llm-{rf.rule}", hazard=rf.hazard,
                           rule=f"llm-{rf.rule}", file=rf.file, line=rf.line, snippet=snippet[:200],
                           message=rf.message, category=rf.category, severity=rf.severity, fixable=False,
                           citations=[Citation(source=f"recipe:{rf.hazard}")]))
    return out
