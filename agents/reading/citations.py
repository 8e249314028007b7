"""Knowledge-base citations for findings, diagnoses and patches, and the port memory.

The knowledge base is used when a store exists (built with `npuport kb build`, or a server named by
NPUPORT_CHROMA_URL); without one, agents cite our recipes only and the report says so. Set
NPUPORT_KB=off to skip it. chromadb and the embedding model load on first use, never at import.
"""

from __future__ import annotations

import os
from typing import Any

from agents.models import Citation, Diagnosis, RunRecord
from agents.request import request_of
from agents.state import diagnoses_of, patches_of, runs_of, target_name_of
from knowledge.errors import first_line
from knowledge.home import npuport_home
from knowledge.settings import settings

_kb: Any = None
_failed = ""


def kb_status() -> str:
    conf = settings()
    if conf.kb_off:
        return "off (NPUPORT_KB=off)"
    if conf.chroma_url:
        return f"server {conf.chroma_url}"
    if (npuport_home() / "chroma").is_dir():
        return f"store {npuport_home() / 'chroma'}"
    return "not built (run `npuport kb build`); citing recipes only"


def _knowledge_base() -> Any:
    global _kb, _failed
    status = kb_status()
    if _failed or status.startswith(("off", "not built")):
        return None
    if _kb is None:
        try:
            from knowledge.kb import KnowledgeBase

            _kb = KnowledgeBase()
        except Exception as exc:  # a broken store must not stop a port; the report says why
            _failed = f"knowledge base unavailable: {first_line(exc)}"
            return None
    return _kb


def kb_citations(query: str, k: int = 2) -> list[Citation]:
    """Top hits for ``query`` as citations; [] when no knowledge base is usable."""
    global _failed
    kb = _knowledge_base()
    if kb is None:
        return []
    try:
        hits = kb.search(query, k=k)
    except Exception as exc:
        _failed = f"knowledge base search failed: {first_line(exc)}"
        return []
    out = []
    for h in hits:
        c = h.citation()
        out.append(Citation(source=c["source"], title=c.get("title", ""), excerpt=c.get("excerpt", "")[:300]))
    return out


def cite_findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add knowledge-base citations to findings: one query per hazard rule, shared by its findings."""
    by_rule: dict[tuple[str, str], list[Citation]] = {}
    for f in findings:
        key = (f["hazard"], f["rule"])
        if key not in by_rule:
            by_rule[key] = kb_citations(f"{f['hazard']} {f['rule']}: {f['message']} {f.get('snippet', '')}")
        have = {c["source"] for c in f.get("citations") or []}
        f["citations"] = list(f.get("citations") or []) + [
            c.model_dump() for c in by_rule[key] if c.source not in have
        ]
    return findings


def record_validated_fixes(state: dict[str, Any]) -> list[str]:
    """Port memory: every fix a diagnosis led to, once the port validated. A fix that no recipe covered
    (the LLM's) is journalled with its codemod and params and the failure it fixed, with or without a
    knowledge-base store, so later ports reuse it (agents/fixing/learned.py); with a store, every fix is indexed too."""
    from knowledge.locks import home_lock
    from knowledge.port_memory import WRITE_LOCK

    kb = _knowledge_base()
    try:
        # concurrent ports (npuport batch) write one journal and one store: one writer at a time
        with home_lock(WRITE_LOCK):
            ids = _journal_learned(state)
            if kb is not None:
                ids += [i for i in _record_fixes(kb, state) if i not in ids]
            return ids
    except (OSError, TimeoutError):  # memory is best effort: the port itself is done
        return []


def _journal_learned(state: dict[str, Any]) -> list[str]:
    """The validated port's fixes that the LLM found (``by: llm``), as port-memory records with the fix."""
    from datetime import date

    from knowledge.port_memory import append_record, failure_key, record_id

    runs = {r.id: r for r in runs_of(state)}
    diagnoses = {d.id: d for d in diagnoses_of(state)}
    req = request_of(state)
    model, target = os.path.basename(req.model_path), target_name_of(state)
    patches = patches_of(state)
    # a fix the debugger later undid (revert-and-retry) is not what the port validated with
    undone = {diagnoses[p.diagnosis_id].params.get("commit") for p in patches
              if p.codemod == "revert-npuport-change" and p.diagnosis_id in diagnoses}
    ids = []
    for p in patches:
        d = diagnoses.get(p.diagnosis_id or "")
        run = runs.get(d.run_id) if d else None
        exc = run.exception if run else None
        if not d or not exc or d.params.get("by") != "llm" or not d.fix or p.commit in undone:
            continue
        params = {k: v for k, v in d.params.items() if k not in ("by", "llm_tokens", "rationale", "prompt_id")}
        sig = _memory_signature(d, runs)
        rec: dict[str, Any] = {"id": record_id(sig, p.summary, model, target), "signature": sig,
               "patch_summary": p.summary, "model": model, "target": target, "hazard": "", "ops": [],
               "files": list(p.files), "date": date.today().isoformat(),
               "failure_key": failure_key(exc.type, exc.message),
               "failure": f"{exc.type}: {first_line(exc.message, 300)}",
               "fix": {"codemod": d.fix, "params": params, "by": "llm", "file": d.file}}
        append_record(rec)
        ids.append(rec["id"])
    return ids


def _memory_signature(d: Diagnosis, runs: dict[str, RunRecord]) -> str:
    """The diagnosis's signature with the failure's first line: searchable text, not only file:line."""
    run = runs.get(d.run_id)
    exc = run.exception if run else None
    if not exc:
        return d.signature
    return f"{d.signature}: {exc.type}: {first_line(exc.message, 300)}"


def _record_fixes(kb: Any, state: dict[str, Any]) -> list[str]:
    runs = {r.id: r for r in runs_of(state)}
    diagnoses = {d.id: d for d in diagnoses_of(state)}
    req = request_of(state)
    ids = []
    for p in patches_of(state):
        d = diagnoses.get(p.diagnosis_id or "")
        if not d:
            continue
        try:
            # the same id as _journal_learned's record (knowledge.port_memory.record_id), so a learned fix
            # journalled there is only indexed here, not journalled twice
            ids.append(kb.record_fix(_memory_signature(d, runs), p.summary, model=os.path.basename(req.model_path),
                                     target=target_name_of(state), files=p.files))
        except Exception:  # memory is best effort; the port itself is done
            continue
    return ids
