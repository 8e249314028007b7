"""patcher: turns findings and diagnoses into patches. Each applied codemod is one git commit in the
workspace whose message names the findings (or diagnosis) and the citations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import libcst as cst

from agents.codemods import CODEMODS
from agents.models import Diagnosis, Finding, Patch
from agents.policies import FixAction, get_policy, policy_context
from agents.trace import step
from agents.workspace import Workspace
from knowledge.errors import first_line


def apply_fix(ws: Workspace, action: FixAction, patch_no: int) -> tuple[Patch | None, list[str]]:
    """Apply one FixAction over its files; commit. Returns the patch (None when nothing changed) and notes."""
    fn, hazard, description = CODEMODS[action.codemod]
    notes: list[str] = []
    edits: list[str] = []
    for rel in action.files:
        path = ws.model_dir / rel
        if not path.is_file():
            notes.append(f"{rel}: not in the workspace")
            continue
        source = path.read_text(encoding="utf-8")
        try:
            result = fn(source, file=rel, **action.params)
        except cst.ParserSyntaxError as exc:
            notes.append(f"{rel}: cannot parse ({first_line(exc)})")
            continue
        if result.changed:
            path.write_text(result.source, encoding="utf-8")
            edits.extend(f"{rel} {e}" for e in result.edits)
        else:
            notes.extend(f"{rel}: {e}" for e in result.edits)  # e.g. an LLM edit that was rejected
    if not edits:
        return None, notes or [f"{action.codemod} changed nothing"]
    cites = ", ".join(c.source for c in action.citations) or f"recipe:{hazard}"
    refs = action.finding_ids or ([action.diagnosis_id] if action.diagnosis_id else [])
    body = "\n".join([f"{description}.", "", *[f"- {e}" for e in edits], "",
                      f"Fixes: {', '.join(refs)}", f"Cites: {cites}"])
    sha = ws.commit(f"npuport {hazard} {action.codemod}: {action.summary}\n\n{body}")
    if sha is None:
        return None, notes
    patch = Patch(id=f"patch-{patch_no}", commit=sha, summary=f"{hazard} {action.codemod}: {action.summary}",
                  finding_ids=action.finding_ids, diagnosis_id=action.diagnosis_id,
                  files=ws.changed_files(sha), codemod=action.codemod, citations=action.citations)
    return patch, notes


def patcher_node(state: dict[str, Any]) -> dict[str, Any]:
    ws = Workspace(Path(state["workdir"]))
    policy = get_policy(state["request"].get("policy", "rule"), context=policy_context(state))
    done = len(state.get("patches") or [])
    pending = state.get("pending_diagnosis")
    if pending:
        action = policy.fix_for(Diagnosis(**pending))
        actions = [action] if action else []
    elif not state.get("static_fixes_done"):
        actions = policy.plan_fixes([Finding(**f) for f in state.get("findings") or []])
    else:
        actions = []
    patches: list[dict[str, Any]] = []
    trace = []
    for action in actions:
        patch, notes = apply_fix(ws, action, done + len(patches) + 1)
        if patch:
            patches.append(patch.model_dump(mode="json"))
            trace.append(step("patcher", f"commit {patch.commit[:8]} {patch.summary}", files=patch.files,
                              citations=[c.source for c in patch.citations]))
        else:
            trace.append(step("patcher", f"{action.codemod}: nothing to change ({'; '.join(notes)})"))
    if not actions:
        trace.append(step("patcher", "no patch to apply"))
    update: dict[str, Any] = {"patches": patches, "static_fixes_done": True, "pending_diagnosis": None, "trace": trace}
    if pending and not patches:
        # Re-running unchanged code would only repeat the failure: stop with the reason instead.
        update["status"] = "failed"
        update["reason"] = f"could not port because the fix for {pending.get('kind')} changed nothing ({pending.get('summary')})"
    return update
