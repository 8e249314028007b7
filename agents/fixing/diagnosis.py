"""Diagnosis skills: a failed run's structured exception as a failure signature, and the port's budget.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from agents.models import Diagnosis, Patch, StructuredException
from agents.request import request_of

# The failure classifier lives with the hazard rules (agents/rules/diagnose.py); re-exported here.
from agents.rules.base import Signature
from agents.rules.diagnose import classify, innermost_model_frame
from agents.state import counters_of, diagnoses_of, patches_of, started_at_of, workdir_if_set
from agents.workspace import Workspace, safe_git

__all__ = ["REVERT_FIX", "Signature", "budget_left", "classify", "escalate", "innermost_model_frame",
           "npuport_change_at", "revert_change", "tried_so_far"]


def budget_left(state: dict[str, Any]) -> tuple[bool, str]:
    """(True, "") while the run may continue, else (False, which budget ran out)."""
    req = request_of(state)
    if counters_of(state).port_runs >= req.max_runs:
        return False, f"the budget of {req.max_runs} sandbox runs is spent"
    started = started_at_of(state) or time.time()
    if time.time() - started >= req.max_wall_s:
        return False, f"the wall-time budget of {req.max_wall_s:g} s is spent"
    return True, ""


# --- revert-and-retry: when the failing line is one npuport changed -------------------------------

REVERT_FIX = "revert-npuport-change"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.M)


def npuport_change_at(ws: Workspace, exc: StructuredException, patches: list[Patch],
                      reverted: set[tuple[str, str, int]]) -> dict[str, Any] | None:
    """The patch whose change the traceback lands in (innermost model frame first), as revert params:
    {"commit", "patch_id", "file", "line" (in the workspace now), "patch_line" (in that commit)}."""
    by_commit = {p.commit: p for p in patches if p.codemod != REVERT_FIX}
    for frame in reversed(exc.frames):
        if not frame.in_model or frame.line <= 0:
            continue
        r = safe_git(ws.git_dir, ws.model_dir, "blame", "--porcelain", "-L", f"{frame.line},{frame.line}", "HEAD",
                     "--", frame.file, check=False)
        if r.returncode != 0:
            continue
        head = r.stdout.decode("utf-8", "replace").split("\n", 1)[0].split()
        if len(head) < 2 or head[0] not in by_commit:
            continue
        patch = by_commit[head[0]]
        if (patch.commit, frame.file, int(head[1])) in reverted:
            continue
        return {"commit": patch.commit, "patch_id": patch.id, "file": frame.file, "line": frame.line,
                "patch_line": int(head[1]), "patch_summary": patch.summary}
    return None


def revert_change(ws: Workspace, params: dict[str, Any]) -> str | None:
    """Undo one patch's change at one site: the diff hunk of ``params["commit"]`` holding the failing line.
    The hunk's new lines are found in the file as it is now (later patches may have moved them) nearest the
    failing line and replaced by the lines they replaced. Returns a description of what was undone, None when
    nothing could be (the lines are gone, or undoing them would leave a use of an npuport helper the file
    no longer defines)."""
    sha, rel, line = params["commit"], params["file"], int(params["patch_line"])
    now_line = int(params.get("line", line))
    diff = safe_git(ws.git_dir, ws.model_dir, "diff", "--no-ext-diff", "--no-textconv", "-U0", f"{sha}^", sha,
                    "--", rel).stdout.decode("utf-8", "replace")
    _head, _, body = diff.partition("\n@@")
    hunks = ["@@" + h for h in ("\n@@" + body).split("\n@@")[1:]] if body else []
    path = ws.model_dir / rel
    for hunk in hunks:
        m = _HUNK.match(hunk)
        if m is None:
            continue
        start, count = int(m.group(3)), int(m.group(4) if m.group(4) is not None else 1)
        if not start <= line < start + max(count, 1):
            continue
        rows = hunk.split("\n")[1:]
        minus = [r[1:] for r in rows if r.startswith("-")]
        plus = [r[1:] for r in rows if r.startswith("+")]
        text = path.read_text(encoding="utf-8")
        cur = text.split("\n")
        if not plus:
            return None
        found = [i for i in range(len(cur) - len(plus) + 1) if cur[i:i + len(plus)] == plus]
        if not found:
            return None
        i = min(found, key=lambda k: abs(k + 1 - now_line))
        new = "\n".join(cur[:i] + minus + cur[i + len(plus):])
        used = set(re.findall(r"\b(_npuport_\w+)\(", new))
        defined = set(re.findall(r"^\s*(?:def|class) (_npuport_\w+)", new, re.M))
        if used - defined:
            return None  # the hunk defined helpers other lines still call
        path.write_text(new, encoding="utf-8")
        return f"{rel}: undid lines {i + 1}-{i + len(plus)} ({sha[:8]}'s change there)"
    return None


# --- when no recipe covers a failure: the next step within the budget ------------------------------

def escalate(state: dict[str, Any], diag: Diagnosis, exc: StructuredException, policy_name: str,
             llm_diagnose: Callable[[str, StructuredException, list[Diagnosis]], Diagnosis] | None = None,
             ) -> tuple[Diagnosis, list[str]]:
    """The next thing to try for a failure no recipe covers, as a diagnosis with a fix (or ``diag`` as it
    is when nothing is left), and notes for the trace. In order: undo npuport's own change where the
    traceback lands (one site at a time); then, under the rule policy with an LLM configured, the LLM
    policy's diagnosis (``llm_diagnose``, which the debugger node passes), which reads the knowledge base's
    passages for the error (the hybrid and llm policies have asked the LLM already)."""
    notes: list[str] = []
    reverted = revert_candidate(state, diag, exc)
    if reverted.fix:
        return reverted, notes
    passages = [c for c in diag.citations if not c.source.startswith("recipe:")]
    if passages:
        notes.append("knowledge base for " + f"{exc.type}: "
                     + "; ".join(f"[{c.source}] {c.title}" for c in passages[:3]))
    if policy_name != "rule":
        return diag, notes
    from knowledge.settings import LLMSettings

    if not LLMSettings().configured:
        notes.append("no LLM is configured to ask (set NPUPORT_LLM_BASE_URL and NPUPORT_LLM_MODEL)")
        return diag.model_copy(update={"params": {**diag.params, "llm": "not configured"}}), notes
    if llm_diagnose is None:
        return diag, notes
    answer = llm_diagnose(diag.run_id, exc, diagnoses_of(state))
    answer = answer.model_copy(update={"id": diag.id})
    known = {c.source for c in answer.citations}
    answer.citations += [c for c in diag.citations if c.source not in known]
    notes.append(f"asked the LLM policy: {answer.fix or 'no fix'} ({answer.summary[:200]})")
    if not answer.fix:
        return diag.model_copy(update={"summary": f"{diag.summary}; the LLM policy proposed no fix "
                                                  f"({answer.summary[:200]})",
                                       "params": {**diag.params, "llm": "no fix"}}), notes
    return answer, notes


def revert_candidate(state: dict[str, Any], diag: Diagnosis, exc: StructuredException) -> Diagnosis:
    """No recipe covers the failure: when the traceback lands in a line one of npuport's patches changed,
    the next thing to try is undoing that change there (one site at a time, never the same one twice)."""
    workdir = workdir_if_set(state)
    if workdir is None:
        return diag
    ws = Workspace(workdir)
    if not ws.has_repo():
        return diag
    done = {(d.params.get("commit", ""), d.params.get("file", ""), int(d.params.get("patch_line", 0)))
            for d in diagnoses_of(state) if d.fix == REVERT_FIX}
    site = npuport_change_at(ws, exc, patches_of(state), done)
    if site is None:
        return diag
    summary = (f"{diag.summary}; the failing line {site['file']}:{site['line']} was changed by npuport's "
               f"{site['patch_id']} ({site['patch_summary']}): revert that change there and run again")
    return diag.model_copy(update={"fix": REVERT_FIX, "params": site, "summary": summary,
                                   "file": site["file"], "line": site["line"]})


def tried_so_far(state: dict[str, Any], last: Diagnosis) -> str:
    """What the debugger tried on this port, for the give-up reason: runs, fixes, reverts, LLM answers and
    the knowledge-base passages consulted for the last failure."""
    diags = [*diagnoses_of(state), last]
    fixes = [d.fix for d in diags if d.fix and d.fix != REVERT_FIX]
    reverts = [d for d in diags if d.fix == REVERT_FIX]
    llm = [d for d in diags if d.params.get("by") == "llm"]
    parts = [f"{counters_of(state).port_runs} sandbox run(s)"]
    if fixes:
        parts.append(f"{len(fixes)} fix(es) ({', '.join(sorted(set(fixes)))})")
    if reverts:
        parts.append(f"{len(reverts)} revert(s) of npuport's own changes")
    if llm:
        parts.append(f"{len(llm)} LLM diagnosis(es)")
    elif last.params.get("llm"):
        parts.append(f"LLM: {last.params['llm']}")
    kb = [c.source for c in last.citations if not c.source.startswith("recipe:")]
    if kb:
        parts.append("knowledge base consulted: " + ", ".join(kb[:3]))
    return "; ".join(parts)
