"""What a job paused at the approval gate would commit next, as a diff, before anyone approves it.

The patcher runs on a throwaway copy of the workspace's git tree (same state, same policy), so the
preview is the patch the real round applies with the rule policy; an LLM policy may answer differently
the second time, and the preview says so."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from agents.request import request_of
from agents.state import workdir_if_set
from graph.jobs_support import GraphBuilder, thread_snapshot


def pending_patches(thread_id: str, db_path: Path | None = None, builder: GraphBuilder | None = None) -> dict[str, Any]:
    """{"applied": diff so far, "pending": [patch records], "pending_diff": the next round's diff, "note"}."""
    from agents.nodes.patcher import patcher_node
    from agents.workspace import Workspace

    snap = thread_snapshot(thread_id, builder=builder, db_path=db_path)
    if snap is None:
        return {"applied": "", "pending": [], "pending_diff": "", "note": "the job has not started"}
    values = snap.values
    workdir = workdir_if_set(values)
    ws = Workspace(workdir) if workdir else None
    if ws is None or not ws.has_repo():
        return {"applied": "", "pending": [], "pending_diff": "", "note": "no workspace yet"}
    # npuport's git (outside the model tree, hardened: agents/workspace.py), never git run in the model folder
    applied = ws.ordered_diff("original", "HEAD")  # the model's changes first, npuport's helper module last
    if "patcher" not in snap.next:
        return {"applied": applied, "pending": [], "pending_diff": "", "note": "not waiting before a patch round"}
    with tempfile.TemporaryDirectory(prefix="npuport-preview-") as tmp:
        shutil.copytree(ws.model_dir, Path(tmp) / ws.model_dir.name, symlinks=True)
        shutil.copytree(ws.git_dir, Path(tmp) / ws.git_dir.name, symlinks=True)
        (Path(tmp) / "runs").mkdir()
        preview = Workspace(Path(tmp))
        before = preview.head()
        out = patcher_node({**values, "workdir": tmp})
        diff = preview.ordered_diff(before, "HEAD")
    policy = request_of(values).policy
    note = "" if policy == "rule" else f"previewed with the {policy} policy; the real round may differ"
    return {"applied": applied, "pending": out.get("patches") or [], "pending_diff": diff, "note": note}
