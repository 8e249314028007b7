"""debugger: turns a failed run's structured exception into a failure signature and a diagnosis.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.

When no recipe covers the failure the debugger keeps going within the port's budget, one step at a time
(agents/fixing/diagnosis.py, ``next_step``): undo npuport's own change where the traceback lands, then ask the LLM
policy (when an LLM is configured) with the knowledge base's passages for the error. Each step is one
patch (a commit or a revert commit) and one more sandbox run; when nothing is left to try, or the budget
is spent, the port stops with a report of what was tried and the passages that were consulted.
"""

from __future__ import annotations

from typing import Any

from agents.fixing.diagnosis import budget_left, escalate, tried_so_far
from agents.models import Diagnosis, RunRecord, StructuredException
from agents.request import request_of
from agents.sites import port_site
from agents.state import counters_of, diagnoses_of, merged, numerics_of, runs_of, workdir_if_set
from agents.trace import step


def debugger_node(state: dict[str, Any]) -> dict[str, Any]:
    """Diagnose the last failure (a failed run or a numerics mismatch) and route a fix, or give up
    with a "could not port because ..." reason."""
    from agents.policies import get_policy, policy_context

    policy = get_policy(request_of(state).policy, context=policy_context(state))
    history = diagnoses_of(state)
    last = runs_of(state)[-1]
    retry = None
    numerics = numerics_of(state)
    extra_update: dict[str, Any] = {}
    if last.ok and numerics is not None and numerics.verdict == "mismatch":
        diag = Diagnosis(id=f"diag-{len(history) + 1}", run_id=last.id, signature="numerics-mismatch",
                         kind="numerics-mismatch",
                         summary=f"the port runs but its outputs differ: {numerics.detail}")
    elif last.exception is not None:
        from agents.environment.release_retry import release_retry
        from agents.fixing.learned import learned_diagnosis
        from agents.policies.rule import recipe_covers

        # a name the run's transformers release lacks: the next candidate release, its environment built
        retry = release_retry(state, last.id, last.exception, history) if budget_left(state)[0] else None
        # a fix an earlier port learned for this failure (port memory) comes before asking the policy's LLM
        learned = None if retry else learned_diagnosis(state, last.id, last.exception, history)
        if retry is None and learned is None and not recipe_covers(last.exception, history):
            # No class fixes it: before npuport blames (and reverts) its own changes or asks an LLM, does the
            # original, as written, fail the same way? A failure a class fixes is fixed even when the original
            # fails so here too (an old release's star import, generate inputs npuport made up).
            fails, state, extra_update = _original_check(state, last, history)
            if fails is not None:
                return fails
        diag = retry.diagnosis if retry else learned or policy.diagnose(last.id, last.exception, history)
    else:
        diag = Diagnosis(id=f"diag-{len(history) + 1}", run_id=last.id, signature=f"status:{last.status}",
                         kind=last.status, summary=f"the run ended with status {last.status}")
    from agents.reading.citations import kb_citations

    query = f"{last.exception.type}: {last.exception.message[:300]}" if last.exception else diag.summary
    known = {c.source for c in diag.citations}
    diag.citations += [c for c in kb_citations(query) if c.source not in known]
    ok, why = budget_left(state)
    notes: list[str] = []
    if not diag.fix and ok and last.exception is not None:
        def llm_diagnose(run_id: str, exc: StructuredException, history: list[Diagnosis]) -> Diagnosis:
            return get_policy("llm", context=policy_context(state)).diagnose(run_id, exc, history)

        diag, notes = escalate(state, diag, last.exception, policy.name, llm_diagnose)
    update: dict[str, Any] = {"diagnoses": [diag.model_dump(mode="json")], **extra_update}
    if retry is not None:
        update["environment"] = retry.environment
    # the traceback's line is one of the patched tree: say it as the user's line where it is one
    where = ""
    if diag.file:
        where = f" ({port_site(f'{diag.file}:{diag.line}', workdir_if_set(state), request_of(state).model_path)})"
    trace = [step("debugger", n) for n in notes]
    if diag.fix and ok:
        update["pending_diagnosis"] = diag.model_dump(mode="json")
        trace.append(step("debugger", f"{diag.kind}{where}: {diag.summary}; fix: {diag.fix}",
                          signature=diag.signature, citations=[c.source for c in diag.citations]))
    else:
        update["status"] = "failed"
        update["reason"] = _give_up_reason(state, diag, ok, why)
        trace.append(step("debugger", f"give up: {update['reason']}", signature=diag.signature,
                          citations=[c.source for c in diag.citations]))
    # What the LLM debugger did, or why the rules decided instead (the report's LLM section lists these).
    update["trace"] = [step("debugger", n, llm=True) for n in policy.notes] + trace
    return update


def _original_check(state: dict[str, Any], last: RunRecord, history: list[Diagnosis],
                    ) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, Any]]:
    """Before npuport blames (and reverts) its own changes: does the original, as written, fail the same way?
    (the update that ends the port when it does, with the rules' reading of the failure; the state with the
    original's runs; their update)."""
    assert last.exception is not None
    if last.status == "timeout" or any(r.purpose == "reference" for r in runs_of(state)):
        return None, state, {}
    from agents.policies.rule import RulePolicy
    from agents.validation.original_failure import model_fails_by_itself

    made, fails = model_fails_by_itself(state, last, lambda where: port_site(
        where, workdir_if_set(state), request_of(state).model_path))
    counters = counters_of(state)
    counters.reference_runs += len(made)
    if fails is not None:
        reading = RulePolicy().diagnose(last.id, last.exception, history)  # what was read: no class fixes it
        return ({"runs": made, "counters": counters.model_dump(), "numerics": fails.model_dump(mode="json"),
                 "status": "failed", "reason": fails.detail, "diagnoses": [reading.model_dump(mode="json")],
                 "trace": [step("debugger", fails.detail, signature=reading.signature)]}, state, {})
    update = {"runs": made, "counters": counters.model_dump()}
    return None, merged(state, update), update


def _give_up_reason(state: dict[str, Any], diag: Diagnosis, ok: bool, why: str) -> str:
    """Why the port stops: the diagnosis, the budget, or no class that fixes it; what was tried."""
    because = diag.summary if ok or not diag.fix else f"{why} ({diag.summary})"
    if not ok and not diag.fix:
        because = f"{diag.summary}; {why}"
    elif not diag.fix:
        because = (_timeout_because(state) if diag.kind == "timeout"
                   else f"{diag.summary}; " + (diag.params.get("unfixed") or f"no recipe covers {diag.kind}"))
    tried = tried_so_far(state, diag)
    # a run stopped at its time limit is said as the timeout it is, not as "could not port"
    opening = "" if diag.kind == "timeout" and not diag.fix else "could not port because "
    return f"{opening}{because}" + (f". Tried: {tried}" if tried else "")


def _timeout_because(state: dict[str, Any]) -> str:
    """The port's run stopped at its wall limit: the limit and the flag that raises it
    (agents/validation/compare.py)."""
    from agents.runs import scaled_limits
    from agents.validation.compare import timeout_detail

    limit = scaled_limits(request_of(state), runs_of(state)[:-1]).wall_s  # the limit it ran under
    return timeout_detail("the port's run", limit, runs_of(state)) + "; " + timeout_hint()


def timeout_hint() -> str:
    """What a run killed at its wall-clock limit asks of the user: a model kept wide (hard-coded sizes, a
    fixed vision tower) is slow on a few CPU cores rather than hung, and the limit is theirs to raise (the flag
    and its value are timeout_detail's: said once)."""
    import os

    return (f"a large model on {os.cpu_count() or 1} CPU core(s) can be slow rather than hung (in a batch, the "
            "manifest's budget.run_timeout_s sets the limit)")
