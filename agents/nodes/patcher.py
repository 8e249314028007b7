"""patcher: turns findings and diagnoses into patches. Each applied codemod is one git commit in the
workspace whose message names the findings (or diagnosis) and the citations."""

from __future__ import annotations

from typing import Any

from agents.environment.release_retry import RELEASE_FIX
from agents.fixing.commits import apply_fix, apply_revert
from agents.fixing.diagnosis import REVERT_FIX
from agents.fixing.inputs_fix import INPUTS_FIX, apply_inputs_fix
from agents.policies import get_policy, policy_context
from agents.request import request_of
from agents.state import (
    findings_of,
    patches_of,
    pending_diagnosis_of,
    static_fixes_done_of,
    target_of,
    workdir_of,
)
from agents.trace import step
from agents.workspace import Workspace
from sandbox.targets import Target


def patcher_node(state: dict[str, Any]) -> dict[str, Any]:
    ws = Workspace(workdir_of(state))
    policy = get_policy(request_of(state).policy, context=policy_context(state))
    done = len(patches_of(state))
    pending = pending_diagnosis_of(state)
    if pending and pending.fix == RELEASE_FIX:
        # the debugger chose another transformers release and built its environment: nothing to commit, run again
        return {"static_fixes_done": True, "pending_diagnosis": None,
                "trace": [step("patcher", f"no patch: the next run uses transformers {pending.params['release']}")]}
    if pending and pending.fix == REVERT_FIX:
        # Undo npuport's own change where the port failed (the debugger found no recipe for the failure).
        patch, notes = apply_revert(ws, pending, done + 1)
        trace = [step("patcher", f"commit {patch.commit[:8]} {patch.summary}" if patch else
                      f"revert: nothing undone ({'; '.join(notes)})", files=patch.files if patch else [])]
        out: dict[str, Any] = {"patches": [patch.model_dump(mode="json")] if patch else [],
                               "static_fixes_done": True, "pending_diagnosis": None, "trace": trace}
        if patch is None:
            out["status"] = "failed"
            out["reason"] = f"could not port because {pending.summary}, and {'; '.join(notes)}"
        return out
    if pending and pending.fix == INPUTS_FIX:
        return apply_inputs_fix(state, pending)  # the run's inputs, not the code (hazard H26)
    fixes_done = static_fixes_done_of(state)
    if pending:
        if pending.params.get("by") == "llm" and policy.name == "rule":
            # the debugger asked the LLM policy when no recipe covered the failure: its fix is the LLM's
            policy = get_policy("llm", context=policy_context(state))
        action = policy.fix_for(pending)
        actions = [action] if action else []
    elif not fixes_done:
        actions = policy.plan_fixes(findings_of(state))
    else:
        actions = []
    patches: list[dict[str, Any]] = []
    trace = [step("patcher", note, llm=True) for note in getattr(policy, "notes", [])]  # the LLM patcher's outcome
    target = target_of(state)
    if not pending and not fixes_done:
        from agents.fixing.learned import learned_actions

        _apply(ws, actions, done, patches, trace, target)
        # then what earlier ports learned (port memory), matched against the code as the plan left it
        actions = [*actions, *_apply(ws, learned_actions(state, ws), done, patches, trace, target)]
    else:
        _apply(ws, actions, done, patches, trace, target)
    if not actions:
        trace.append(step("patcher", "no patch to apply"))
    update: dict[str, Any] = {"patches": patches, "static_fixes_done": True, "pending_diagnosis": None, "trace": trace}
    if pending and not patches:
        # Re-running unchanged code would only repeat the failure: stop with the reason instead.
        update["status"] = "failed"
        update["reason"] = (f"could not port because the fix for {pending.kind} changed nothing "
                            f"({pending.summary})")
    return update


def _apply(ws: Workspace, actions: list[Any], done: int, patches: list[dict[str, Any]],
           trace: list[dict[str, Any]], target: Target | None = None) -> list[Any]:
    """Apply ``actions`` in order (one commit each), adding to ``patches`` and ``trace``; returns them.
    ``target`` reaches codemods whose choice depends on the chip (H12's cast policy)."""
    for action in actions:
        patch, notes = apply_fix(ws, action, done + len(patches) + 1, target=target)
        if patch:
            patches.append(patch.model_dump(mode="json"))
            trace.append(step("patcher", f"commit {patch.commit[:8]} {patch.summary}", files=patch.files,
                              citations=[c.source for c in patch.citations]))
        else:
            trace.append(step("patcher", f"{action.codemod}: nothing to change ({'; '.join(notes)})"))
    return actions
