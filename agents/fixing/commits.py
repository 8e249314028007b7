"""Applying one fix (a codemod chosen by the policy) to the workspace as one git commit."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

import libcst as cst

from agents.fixing.codemods import CODEMODS
from agents.models import Diagnosis, FixAction, Patch
from agents.workspace import Workspace
from knowledge.errors import WorkspaceError, first_line
from sandbox.targets import Target


def apply_fix(ws: Workspace, action: FixAction, patch_no: int,
              target: Target | None = None) -> tuple[Patch | None, list[str]]:
    """Apply one FixAction over its files; commit. Returns the patch (None when nothing changed) and notes.
    ``target`` (the resolved target) reaches codemods whose choice depends on the chip (H12's cast
    policy)."""
    fn, hazard, description = CODEMODS[action.codemod]
    notes: list[str] = []
    edits: list[str] = []
    sites: list[str] = []
    declined: list[str] = []
    for rel in action.files:
        path = ws.model_dir / rel
        if not path.is_file():
            notes.append(f"{rel}: not in the workspace")
            continue
        source = path.read_text(encoding="utf-8")
        try:
            result = fn(source, file=rel, **({"target": target} if target is not None else {}), **action.params)
        except cst.ParserSyntaxError as exc:
            notes.append(f"{rel}: cannot parse ({first_line(exc)})")
            continue
        to_orig = _to_original_lines(ws, rel, source)
        declined.extend(f"{rel} {_renumber(e, to_orig)}" for e in result.skipped)
        if result.changed:
            path.write_text(_helpers_apart(ws, rel, result.source), encoding="utf-8")
            edits.extend(f"{rel} {_renumber(e, to_orig)}" for e in result.edits)
            sites.extend(f"{rel}:{to_orig(a)}-{max(to_orig(a), to_orig(b))}" for a, b in result.spans)
        else:
            notes.extend(f"{rel}: {e}" for e in result.edits)  # e.g. an LLM edit that was rejected
    if not edits:
        return None, [*notes, *declined] or [f"{action.codemod} changed nothing"]
    cites = ", ".join(c.source for c in action.citations) or f"recipe:{hazard}"
    refs = action.finding_ids or ([action.diagnosis_id] if action.diagnosis_id else [])
    body = "\n".join([f"{description}.", "", *[f"- {e}" for e in edits], "",
                      f"Fixes: {', '.join(refs)}", f"Cites: {cites}"])
    sha = ws.commit(f"npuport {hazard} {action.codemod}: {action.summary}\n\n{body}")
    if sha is None:
        return None, notes
    patch = Patch(id=f"patch-{patch_no}", commit=sha, summary=f"{hazard} {action.codemod}: {action.summary}",
                  finding_ids=action.finding_ids, diagnosis_id=action.diagnosis_id,
                  files=ws.changed_files(sha), codemod=action.codemod, citations=action.citations,
                  edits=edits, sites=sites, declined=declined)
    return patch, notes


def _helpers_apart(ws: Workspace, rel: str, source: str) -> str:
    """The fixed file with the helpers npuport inserted moved to the helper module beside it
    (agents/fixing/helper_module.py), which is written here."""
    from agents.fixing.helper_module import HELPER_FILE, move_helpers

    helper_path = (ws.model_dir / rel).parent / HELPER_FILE
    try:
        original = ws.git("show", f"original:{rel}")
    except WorkspaceError:
        original = ""
    prior = helper_path.read_text(encoding="utf-8") if helper_path.is_file() else None
    source, helpers = move_helpers(source, original, prior)
    if helpers is not None:
        helper_path.write_text(helpers, encoding="utf-8")
    return source


def apply_revert(ws: Workspace, diagnosis: Diagnosis, patch_no: int) -> tuple[Patch | None, list[str]]:
    """Undo the change of an earlier patch at the site where the port failed, as one revert commit."""
    from agents.fixing.diagnosis import REVERT_FIX, revert_change

    p = diagnosis.params
    done = revert_change(ws, p)
    if done is None:
        return None, [f"could not undo {p.get('patch_id')} at {p.get('file')}:{p.get('line')}"]
    body = "\n".join([f"The port failed at {p['file']}:{p['line']}, a line npuport's {p['patch_id']} changed "
                      f"({p.get('patch_summary', '')}); no recipe covers the failure, so that change is undone "
                      "there.", "", f"- {done}", "", f"Reverts: {p['commit']}", f"Fixes: {diagnosis.id}"])
    sha = ws.commit(f"npuport revert {p['patch_id']} at {p['file']}:{p['line']}\n\n{body}")
    if sha is None:
        return None, ["the revert changed nothing"]
    patch = Patch(id=f"patch-{patch_no}", commit=sha, summary=f"revert {p['patch_id']} at {p['file']}:{p['line']}",
                  diagnosis_id=diagnosis.id, files=ws.changed_files(sha), codemod=REVERT_FIX,
                  citations=diagnosis.citations)
    return patch, [done]


def _to_original_lines(ws: Workspace, rel: str, current: str) -> Callable[[int], int]:
    """Maps a line of the file as it is now (earlier patches may have inserted helpers) to the line of the
    original the findings point at; a line earlier patches wrote maps to the original lines they replaced."""
    try:
        original = ws.git("show", f"original:{rel}")
    except WorkspaceError:
        return lambda n: n
    if original == current:
        return lambda n: n
    blocks = difflib.SequenceMatcher(a=current.splitlines(), b=original.splitlines(),
                                     autojunk=False).get_matching_blocks()

    def to_orig(line: int) -> int:
        i = line - 1
        after = 0
        for a, b, size in blocks:
            if a <= i < a + size:
                return b + (i - a) + 1
            if a + size <= i:
                after = b + size
        return after + 1

    return to_orig


def _renumber(edit: str, to_orig: Callable[[int], int]) -> str:
    """"line N: what" (or "line N-M: why") with the lines counted in the original file."""
    m = re.match(r"line (\d+)(?:-(\d+))?: ", edit)
    if not m:
        return edit
    start = to_orig(int(m.group(1)))
    end = f"-{max(start, to_orig(int(m.group(2))))}" if m.group(2) else ""
    return f"line {start}{end}: {edit[m.end():]}"
