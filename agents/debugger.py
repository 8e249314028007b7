"""debugger: turns a failed run's structured exception into a failure signature and a diagnosis.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.
"""

from __future__ import annotations

import time
from typing import Any

from agents.models import Diagnosis, RunRecord
from agents.rules.base import Signature
from agents.rules.diagnose import classify, innermost_model_frame
from agents.trace import step

# Signatures and the patterns behind them live with the hazard rules (agents/rules/); re-exported here.
__all__ = ["Signature", "budget_left", "classify", "debugger_node", "innermost_model_frame"]


def budget_left(state: dict[str, Any]) -> tuple[bool, str]:
    """(True, "") while the run may continue, else (False, which budget ran out)."""
    req = state["request"]
    runs = (state.get("counters") or {}).get("port_runs", 0)
    if runs >= req.get("max_runs", 8):
        return False, f"the budget of {req.get('max_runs')} sandbox runs is spent"
    started = state.get("started_at") or time.time()
    if time.time() - started >= req.get("max_wall_s", 1800):
        return False, f"the wall-time budget of {req.get('max_wall_s'):g} s is spent"
    return True, ""


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
        diag = policy.diagnose(last.id, last.exception, history)
    else:
        diag = Diagnosis(id=f"diag-{len(history) + 1}", run_id=last.id, signature=f"status:{last.status}",
                         kind=last.status, summary=f"the run ended with status {last.status}")
    from agents.citations import kb_citations

    query = f"{last.exception.type}: {last.exception.message[:300]}" if last.exception else diag.summary
    known = {c.source for c in diag.citations}
    diag.citations += [c for c in kb_citations(query) if c.source not in known]
    ok, why = budget_left(state)
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
