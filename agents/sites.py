"""A file:line of the port's own runs (profiler stacks, tracebacks: line numbers of the PATCHED tree) as
the user can open it: the same line in their original file, found through the diff between the
workspace's ``original`` commit and the patched tree; or, for a line the port added or changed, the
patched line labelled "(in patched/)" (the bundle's patched/ tree holds that file)."""

from __future__ import annotations

import difflib
from pathlib import Path

from agents.workspace import Workspace
from knowledge.errors import WorkspaceError

PATCHED_TAG = " (in patched/)"
OUTSIDE_TAG = " (outside the model's files)"


def original_line(original: str, patched: str, line: int) -> int | None:
    """The 1-based line of ``original`` that line ``line`` of ``patched`` is an unchanged copy of; None
    when the port inserted or rewrote that line."""
    a, b = original.splitlines(), patched.splitlines()
    for tag, i1, _i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if j1 <= line - 1 < j2:
            return i1 + (line - 1 - j1) + 1 if tag == "equal" else None
    return None


def _original_text(ws: Workspace, rel: str, user_model: Path | None) -> str | None:
    """The file as the user gave it: the workspace's ``original`` commit (what the port started from),
    else the user's folder."""
    if ws.has_repo():
        try:
            return ws.git("show", f"original:{rel}")
        except WorkspaceError:
            return None  # not in the original commit: a file the port added
    if user_model is not None and (user_model / rel).is_file():
        return (user_model / rel).read_text(errors="replace")
    return None


def port_site(where: str | None, workdir: str | Path | None, user_model: str | Path | None = None) -> str | None:
    """``where`` ('rel/file.py:LINE' in the patched tree) mapped into the user's file, or labelled."""
    if not where:
        return where
    file, sep, line = str(where).rpartition(":")
    if not sep or not line.isdigit():
        return str(where)
    if Path(file).is_absolute():  # the profiler and the harness give model files relative to the model
        return f"{where}{OUTSIDE_TAG}"
    if not workdir:
        return str(where)
    ws = Workspace(Path(workdir))
    patched = ws.model_dir / file
    if not patched.is_file():
        return f"{where}{OUTSIDE_TAG}"
    original = _original_text(ws, file, Path(user_model) if user_model else None)
    if original is None:
        return f"{where}{PATCHED_TAG}"
    mapped = original_line(original, patched.read_text(errors="replace"), int(line))
    return f"{file}:{mapped}" if mapped is not None else f"{where}{PATCHED_TAG}"
