"""Reusing what earlier ports learned: fixes in the port memory (knowledge/port_memory.py) that no recipe
covered and that led to a validated port (an LLM's edit, or a codemod it chose for a new failure).

Two ways in, both without the LLM:
- before the first run (patcher): a learned search/replace edit whose code is in this model, for the same
  target, is applied at once, so the failure it fixed does not happen here (no failed run, no LLM call);
- after a failure (debugger): a learned fix of the same failure (``failure_key``: type and message, not
  file and line) that applies to this model becomes the diagnosis, before the policy (and its LLM) is asked.

A learned edit is matched by its code, not by file names: each block goes to the one file of this model
that holds its search text exactly once, and the whole edit is dry-run (it must apply and parse) first.
Every use cites the record (``memory:<id>``), which the report and the batch table show."""

from __future__ import annotations

import json
from typing import Any

from agents.models import Citation, Diagnosis, FixAction, StructuredException
from agents.state import target_name_of, workdir_if_set
from agents.workspace import Workspace

LLM_EDIT = "llm-edit"


def _citation(rec: dict[str, Any]) -> Citation:
    return Citation(source=str(rec["id"]), title=f"learned by the port of {rec.get('model', '?')}",
                    excerpt=f"{rec.get('failure', rec.get('signature', ''))} -> {rec.get('patch_summary', '')}"[:300])


def _py_files(ws: Workspace) -> list[str]:
    return [f for f in ws.git("ls-files").splitlines() if f.endswith(".py")]


def retarget(ws: Workspace, edits: list[dict[str, Any]], prefer: str | None = None) -> list[dict[str, Any]] | None:
    """The learned edit's blocks moved onto this model's files (each to the one file holding its search
    text exactly once, ``prefer`` first); None unless every block finds a home and the edit dry-runs clean."""
    from agents.fixing.llm_edits import apply_llm_edit

    files = _py_files(ws)
    if prefer in files:
        files = [prefer, *[f for f in files if f != prefer]]
    texts: dict[str, str] = {}
    out = []
    for e in edits:
        search = str(e.get("search") or "")
        if not search.strip():
            return None
        home = None
        for f in files:
            if f not in texts:
                try:
                    texts[f] = (ws.model_dir / f).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    texts[f] = ""
            if texts[f].count(search) == 1:
                home = f
                break
        if home is None:
            return None
        out.append({"file": home, "search": search, "replace": str(e.get("replace") or "")})
    return out if apply_llm_edit(ws.model_dir, {"edits": out}, write=False).ok else None


def learned_actions(state: dict[str, Any], ws: Workspace) -> list[FixAction]:
    """The learned edits (same target) whose code is in this model, as fixes to apply before the first run."""
    from knowledge.port_memory import learned_fixes

    target = target_name_of(state)
    actions: list[FixAction] = []
    seen: set[str] = set()
    for rec in learned_fixes():
        fix = rec["fix"]
        if fix["codemod"] != LLM_EDIT or rec.get("target") != target:
            continue
        edits = retarget(ws, list((fix.get("params") or {}).get("edits") or []))
        if edits is None or (key := json.dumps(edits, sort_keys=True)) in seen:
            continue
        seen.add(key)
        actions.append(FixAction(codemod=LLM_EDIT, files=sorted({e["file"] for e in edits}), params={"edits": edits},
                                 summary=f"learned fix {rec['id']} (from the port of {rec.get('model', '?')}): "
                                         f"{rec.get('patch_summary', '')}"[:400],
                                 citations=[_citation(rec)]))
    return actions


def learned_diagnosis(state: dict[str, Any], run_id: str, exc: StructuredException,
                      history: list[Diagnosis]) -> Diagnosis | None:
    """A learned fix of this failure that applies to this model, as the debugger's diagnosis; None when
    a recipe covers the failure, nothing was learned for it, or its learned fix was tried here already."""
    from agents.rules.diagnose import classify, explain
    from knowledge.port_memory import failure_key, learned_fixes

    sig = classify(exc)
    if explain(sig)[0]:
        return None  # a recipe covers it: the policy's own diagnosis names that fix
    key = failure_key(exc.type, exc.message)
    tried = {c.source for d in history for c in d.citations if c.source.startswith("memory:")}
    workdir = workdir_if_set(state)
    ws = Workspace(workdir) if workdir else None
    frame = sig.frame
    for rec in learned_fixes():
        if rec["failure_key"] != key or rec["id"] in tried or ws is None:
            continue
        fix = rec["fix"]
        params = dict(fix.get("params") or {})
        if fix["codemod"] == LLM_EDIT:
            edits = retarget(ws, list(params.get("edits") or []), prefer=frame.file if frame else None)
            if edits is None:
                continue
            params, file = {"edits": edits}, edits[0]["file"]
        else:
            file = frame.file if frame else None
            if file is None or not _codemod_changes(ws, fix["codemod"], file, params):
                continue
        return Diagnosis(id=f"diag-{len(history) + 1}", run_id=run_id, signature=sig.key, kind=sig.kind,
                         summary=f"{sig.summary}; the port of {rec.get('model', '?')} fixed this failure before "
                                 f"({rec['id']}): {rec.get('patch_summary', '')}"[:600],
                         file=file, line=frame.line if frame else None, fix=fix["codemod"], params=params,
                         citations=[_citation(rec)])
    return None


def _codemod_changes(ws: Workspace, codemod: str, file: str, params: dict[str, Any]) -> bool:
    from agents.fixing.codemods import CODEMODS

    if codemod not in CODEMODS:
        return False
    try:
        return bool(CODEMODS[codemod][0]((ws.model_dir / file).read_text(encoding="utf-8"), file=file,
                                         **params).changed)
    except Exception:  # noqa: BLE001 - a learned codemod that does not fit this model is simply not reused
        return False
