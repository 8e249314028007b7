"""The rule (offline) policy: findings and failure signatures -> recipes -> codemods. No LLM."""

from __future__ import annotations

from agents.models import Citation, Diagnosis, Finding, FixAction, StructuredException
from agents.reasoning import think
from agents.rules.diagnose import classify, explain, no_fix_reason
from agents.rules.registry import active


def _recipe(hazard: str, title: str) -> Citation:
    return Citation(source=f"recipe:{hazard}", title=title)


def fix_file(path: object) -> str | None:
    """A file a class names for its fix (another file than the failing frame's, e.g. the model's function a
    newer release calls), when it is a relative path to a Python file inside the model; else None."""
    if not isinstance(path, str) or not path.endswith(".py") or path.startswith(("/", "\\")):
        return None
    parts = path.split("/")
    return path if all(p and p not in (".", "..") for p in parts) else None


def _line(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class RulePolicy:
    name = "rule"

    def __init__(self) -> None:
        self.notes: list[str] = []  # the rules decide silently; their reasoning goes to think()

    def plan_fixes(self, findings: list[Finding]) -> list[FixAction]:
        actions: list[FixAction] = []
        # The static fixes of the rule registry, in plan order (imports first, so later codemods parse what
        # will run; performance rewrites last). A finding is planned exactly when the scanner called it fixable.
        for codemod, covers in active().static_plan():
            hits = [f for f in findings if f.fixable and f.rule in covers.get(f.hazard, ())]
            if not hits:
                continue
            files = sorted({f.file for f in hits})
            ids = [f.id for f in hits]
            hz = ", ".join(sorted({f.hazard for f in hits}))
            citations = {c.source: c for f in hits for c in f.citations}
            if not citations:
                citations = {f"recipe:{h}": _recipe(h, "") for h in sorted({f.hazard for f in hits})}
            actions.append(FixAction(codemod=codemod, files=files, finding_ids=ids,
                                     params=active().plan_params(codemod, findings),
                                     summary=f"{codemod} ({hz}): {len(hits)} finding(s) in {', '.join(files)}",
                                     citations=list(citations.values())))
        think("patcher", "rules", "the recipes plan " + ("; ".join(a.summary for a in actions) if actions
                                                           else "no patch: no finding has a codemod"))
        return actions

    def diagnose(self, run_id: str, exception: StructuredException, history: list[Diagnosis]) -> Diagnosis:
        sig = classify(exception)
        frame = sig.frame
        fix, params, citations = explain(sig)  # the hazard rule whose error pattern matched, if any
        summary = sig.summary
        if any(d.signature == sig.key for d in history):
            # The same failure after its fix: the recipe did not help. Stop rather than loop.
            summary = f"{sig.summary}; the same failure came back after its fix, so no recipe makes progress"
            fix = None
        unfixed = None if fix else no_fix_reason(sig)
        if unfixed:
            params = {**params, "unfixed": unfixed}  # the give-up reason names the class (debugger node)
        if isinstance(sig.details.get("transformers_name"), dict):
            # a transformers name missing here: the environment's retry of another release reads it
            params = {**params, "transformers_name": dict(sig.details["transformers_name"])}
        think("debugger", "rules", f"{sig.kind}: {summary}; fix: {fix or unfixed or 'none (no recipe covers it)'}")
        return Diagnosis(
            id=f"diag-{len(history) + 1}",
            run_id=run_id,
            signature=sig.key,
            kind=sig.kind,
            summary=summary,
            file=fix_file(sig.details.get("file")) or (frame.file if frame else None),
            line=_line(sig.details.get("line")) if fix_file(sig.details.get("file")) else frame.line if frame else None,
            fix=fix,
            params=params,
            citations=citations,
        )

    def fix_for(self, diagnosis: Diagnosis) -> FixAction | None:
        if not diagnosis.fix or not diagnosis.file:
            return None
        return FixAction(codemod=diagnosis.fix, files=[diagnosis.file], params=diagnosis.params,
                         diagnosis_id=diagnosis.id, summary=f"{diagnosis.fix}: {diagnosis.summary}",
                         citations=diagnosis.citations)
