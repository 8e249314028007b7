"""Diagnosis skills: a failed run's structured exception as a failure signature, and the port's budget.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.
"""

from __future__ import annotations

import re
import time
from typing import Any

from agents.models import StructuredException

# The failure classifier lives with the hazard rules (agents/rules/diagnose.py); re-exported here.
from agents.rules.base import Signature
from agents.rules.diagnose import classify, innermost_model_frame
from agents.workspace import Workspace, safe_git

__all__ = ["REVERT_FIX", "Signature", "budget_left", "classify", "innermost_model_frame", "npuport_change_at",
           "revert_change"]


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


# --- revert-and-retry: when the failing line is one npuport changed -------------------------------

REVERT_FIX = "revert-npuport-change"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.M)


def npuport_change_at(ws: Workspace, exc: StructuredException, patches: list[dict[str, Any]],
                      reverted: set[tuple[str, str, int]]) -> dict[str, Any] | None:
    """The patch whose change the traceback lands in (innermost model frame first), as revert params:
    {"commit", "patch_id", "file", "line" (in the workspace now), "patch_line" (in that commit)}."""
    by_commit = {p["commit"]: p for p in patches if p.get("codemod") != REVERT_FIX}
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
        if (patch["commit"], frame.file, int(head[1])) in reverted:
            continue
        return {"commit": patch["commit"], "patch_id": patch["id"], "file": frame.file, "line": frame.line,
                "patch_line": int(head[1]), "patch_summary": patch.get("summary", "")}
    return None


def revert_change(ws: Workspace, params: dict[str, Any]) -> str | None:
    """Undo one patch's change at one site: the diff hunk of ``params["commit"]`` holding the failing line,
    else that commit's whole change to the file. Returns a description of what was undone, None when
    nothing could be."""
    sha, rel, line = params["commit"], params["file"], int(params["patch_line"])
    diff = safe_git(ws.git_dir, ws.model_dir, "diff", "--no-ext-diff", "--no-textconv", "-U0", f"{sha}^", sha,
                    "--", rel).stdout.decode("utf-8", "replace")
    head, _, body = diff.partition("\n@@")
    hunks = ["@@" + h for h in ("\n@@" + body).split("\n@@")[1:]] if body else []
    for hunk in hunks:
        m = _HUNK.match(hunk)
        if m is None:
            continue
        start, count = int(m.group(3)), int(m.group(4) if m.group(4) is not None else 1)
        if start <= line < start + max(count, 1):
            one = f"{head}\n{hunk.rstrip(chr(10))}\n"
            r = safe_git(ws.git_dir, ws.model_dir, "apply", "-R", "--unidiff-zero", "-", input=one.encode(),
                         check=False)
            if r.returncode == 0:
                return f"{rel}: undid lines {start}-{start + max(count, 1) - 1} of {sha[:8]}"
    r = safe_git(ws.git_dir, ws.model_dir, "apply", "-R", "--unidiff-zero", "-", input=diff.encode(), check=False)
    return f"{rel}: undid {sha[:8]}'s whole change to the file" if r.returncode == 0 and diff else None
