"""debugger: turns a failed run's structured exception into a failure signature and a diagnosis.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.diagnosis import REVERT_FIX, budget_left, npuport_change_at
from agents.models import Diagnosis, RunRecord
from agents.trace import step


def debugger_node(state: dict[str, Any]) -> dict[str, Any]:
    """Diagnose the last failure (a failed run or a numerics mismatch) and route a fix, or give up
    with a "could not port because ..." reason."""
    from agents.policies import get_policy, policy_context

    policy = get_policy(state["request"].get("policy", "rule"), context=policy_context(state))
    history = [Diagnosis(**d) for d in state.get("diagnoses") or []]
    last = RunRecord(**(state.get("runs") or [])[-1])
    numerics = state.get("numerics") or {}
    if last.ok and numerics.get("verdict") == "mismatch":
        diag = Diagnosis(id=f"diag-{len(history) + 1}", run_id=last.id, signature="numerics-mismatch",
                         kind="numerics-mismatch", summary=f"the port runs but its outputs differ: {numerics.get('detail')}")
    elif last.exception is not None:
        from agents.learned import learned_diagnosis

        # a fix an earlier port learned for this failure (port memory) comes before asking the policy's LLM
        diag = (learned_diagnosis(state, last.id, last.exception, history)
                or policy.diagnose(last.id, last.exception, history))
    else:
        diag = Diagnosis(id=f"diag-{len(history) + 1}", run_id=last.id, signature=f"status:{last.status}",
                         kind=last.status, summary=f"the run ended with status {last.status}")
    from agents.citations import kb_citations

    query = f"{last.exception.type}: {last.exception.message[:300]}" if last.exception else diag.summary
    known = {c.source for c in diag.citations}
    diag.citations += [c for c in kb_citations(query) if c.source not in known]
    ok, why = budget_left(state)
    if not diag.fix and ok and last.exception is not None:
        diag = _revert_candidate(state, diag, last.exception)
    update: dict[str, Any] = {"diagnoses": [diag.model_dump(mode="json")]}
    where = f" ({diag.file}:{diag.line})" if diag.file else ""
    if diag.fix and ok:
        update["pending_diagnosis"] = diag.model_dump(mode="json")
        update["trace"] = [step("debugger", f"{diag.kind}{where}: {diag.summary}; fix: {diag.fix}",
                                signature=diag.signature, citations=[c.source for c in diag.citations])]
    else:
        because = diag.summary if ok or not diag.fix else f"{why} ({diag.summary})"
        if not diag.fix and ok:
            because = f"{diag.summary}; no recipe covers {diag.kind}"
        update["status"] = "failed"
        update["reason"] = f"could not port because {because}"
        update["trace"] = [step("debugger", f"give up: {update['reason']}", signature=diag.signature)]
    return update


def _revert_candidate(state: dict[str, Any], diag: Diagnosis, exc: Any) -> Diagnosis:
    """No recipe covers the failure: when the traceback lands in a line one of npuport's patches changed,
    the next thing to try is undoing that change there (one site at a time, never the same one twice)."""
    from agents.workspace import Workspace

    workdir = state.get("workdir")
    if not workdir:
        return diag
    ws = Workspace(Path(workdir))
    if not ws.has_repo():
        return diag
    done = {(d["params"].get("commit", ""), d["params"].get("file", ""), int(d["params"].get("patch_line", 0)))
            for d in state.get("diagnoses") or [] if d.get("fix") == REVERT_FIX}
    site = npuport_change_at(ws, exc, state.get("patches") or [], done)
    if site is None:
        return diag
    summary = (f"{diag.summary}; the failing line {site['file']}:{site['line']} was changed by npuport's "
               f"{site['patch_id']} ({site['patch_summary']}): revert that change there and run again")
    return diag.model_copy(update={"fix": REVERT_FIX, "params": site, "summary": summary,
                                   "file": site["file"], "line": site["line"]})
