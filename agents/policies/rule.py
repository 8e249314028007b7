"""The rule (offline) policy: findings and failure signatures -> recipes -> codemods. No LLM."""

from __future__ import annotations

from agents.debugger import classify
from agents.models import Citation, Diagnosis, Finding, StructuredException
from agents.policies.base import FixAction

# Static fixes, applied in this order (imports first, so later codemods parse what will run).
_FINDING_FIXES: list[tuple[str, set[str], set[str] | None]] = [
    # (codemod, hazards it fixes, rules it fixes or None for all rules of those hazards)
    ("guard-cuda-only-imports", {"H3"}, {"cuda-only-import", "unused-cuda-only-import"}),
    ("cuda-autocast", {"H2"}, {"cuda-autocast"}),
    ("device-agnostic", {"H1", "H11"}, {"cuda-call", "cuda-device-string", "torch-cuda-api", "cuda-visible-devices",
                                        "device-fallback-to-cpu", "masked-scatter-device"}),
    ("float64-to-float32", {"H5"}, {"float64"}),
    ("nccl-to-hccl", {"H9"}, {"nccl-backend"}),
    # Performance rewrites, after the correctness fixes (each proven harmless by the tokens check).
    ("vectorise-mask-loops", {"H6"}, {"elementwise-loop"}),
    ("moe-dense-dispatch", {"H6"}, {"per-expert-loop", "numpy-sync", "item-sync"}),
    ("fused-rms-norm", {"H4"}, {"rms-norm-opportunity"}),
    ("fused-rotary-mul", {"H4"}, {"rotary-opportunity"}),
    ("fused-attention", {"H4"}, {"fused-attention-opportunity"}),
]

def _recipe(hazard: str, title: str) -> Citation:
    return Citation(source=f"recipe:{hazard}", title=title)


def _fixable(f: Finding, hazards: set[str], rules: set[str] | None) -> bool:
    if f.hazard not in hazards:
        return False
    return rules is None or f.rule in rules


class RulePolicy:
    name = "rule"

    def plan_fixes(self, findings: list[Finding]) -> list[FixAction]:
        actions: list[FixAction] = []
        for codemod, hazards, rules in _FINDING_FIXES:
            hits = [f for f in findings if _fixable(f, hazards, rules)]
            if not hits:
                continue
            files = sorted({f.file for f in hits})
            ids = [f.id for f in hits]
            hz = ", ".join(sorted({f.hazard for f in hits}))
            citations = {c.source: c for f in hits for c in f.citations}
            if not citations:
                citations = {f"recipe:{h}": _recipe(h, "") for h in sorted({f.hazard for f in hits})}
            actions.append(FixAction(codemod=codemod, files=files, finding_ids=ids,
                                     summary=f"{codemod} ({hz}): {len(hits)} finding(s) in {', '.join(files)}",
                                     citations=list(citations.values())))
        return actions

    def diagnose(self, run_id: str, exception: StructuredException, history: list[Diagnosis]) -> Diagnosis:
        sig = classify(exception)
        frame = sig.frame
        fix: str | None = None
        params: dict[str, object] = {}
        citations: list[Citation] = []
        if sig.kind == "missing-cuda-module" and frame:
            fix, citations = "guard-cuda-only-imports", [_recipe("H3", "CUDA-only libraries")]
        elif sig.kind == "cuda-assert" and frame:
            fix, citations = "device-agnostic", [_recipe("H1", "hard-coded CUDA")]
        elif sig.kind == "device-mismatch" and frame:
            fix, params, citations = "align-devices", {"line": frame.line}, [_recipe("H11", "mixed devices")]
        elif sig.kind == "npu-dtype" and "DT_DOUBLE" in sig.key and frame:
            fix, citations = "float64-to-float32", [_recipe("H5", "float64 on the NPU")]
        elif sig.kind == "npu-fallback-disabled":
            citations = [_recipe("H7", "ops that fall back to the CPU")]
        summary = sig.summary
        if any(d.signature == sig.key for d in history):
            # The same failure after its fix: the recipe did not help. Stop rather than loop.
            summary = f"{sig.summary}; the same failure came back after its fix, so no recipe makes progress"
            fix = None
        return Diagnosis(
            id=f"diag-{len(history) + 1}",
            run_id=run_id,
            signature=sig.key,
            kind=sig.kind,
            summary=summary,
            file=frame.file if frame else None,
            line=frame.line if frame else None,
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
