"""The port memory's journal, ``<home>/port_memory.jsonl``: fixes that led to validated ports, one JSON
record a line. It is the knowledge base's port-memory source (knowledge/kb indexes it into Chroma when
a store exists) and it is written with or without a store, so what one port learned (a fix no recipe
covered, e.g. an LLM's edit) is there for the next port, in the same batch or later.

Writers serialize on one home lock (``WRITE_LOCK``, an fcntl lock: it holds between any processes
on this machine, Ray workers included, and the kernel drops it when a holder dies). On a multi-node Ray
cluster the home must be a shared folder whose file system honours flock."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from knowledge.home import npuport_home
from knowledge.kb.chunking import digest

JOURNAL = "port_memory.jsonl"
WRITE_LOCK = "knowledge-base"  # knowledge.locks.home_lock name shared by every knowledge-base writer


def journal_path(home: Path | None = None) -> Path:
    return (home or npuport_home()) / JOURNAL


def record_id(signature: str, patch_summary: str, model: str, target: str) -> str:
    """The id of a record: the same fix of the same failure in the same model is one record."""
    return "memory:" + digest(signature, patch_summary, model, target)


_ADDR = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(?:/[\w.+-]+)+/?")
_NUM = re.compile(r"\d+")


def failure_key(exc_type: str, message: str) -> str:
    """A failure as it reads in any model: the exception type and its first message line, with
    addresses, paths and numbers blanked (a signature names the file and line; this does not)."""
    first = (message.strip().splitlines() or [""])[0]
    text = _NUM.sub("N", _PATH.sub("<path>", _ADDR.sub("<addr>", first)))
    return f"{exc_type}: {' '.join(text.split())[:240]}"


def read_records(home: Path | None = None) -> list[dict[str, Any]]:
    """Every record of the journal, in order (a torn last line from a crash is skipped)."""
    path = journal_path(home)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("id"):
            out.append(rec)
    return out


def append_record(rec: dict[str, Any], home: Path | None = None) -> bool:
    """Append ``rec`` unless its id is there already; False when it was. The caller holds
    ``home_lock(WRITE_LOCK)``: the read and the append must be one step for concurrent ports."""
    if any(r["id"] == rec["id"] for r in read_records(home)):
        return False
    path = journal_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return True


def learned_fixes(home: Path | None = None) -> list[dict[str, Any]]:
    """Records that carry an actionable fix (``fix``: codemod and params) and the ``failure_key`` it
    fixed, one per distinct fix, oldest first."""
    seen: set[str] = set()
    out = []
    for rec in read_records(home):
        fix = rec.get("fix")
        if not isinstance(fix, dict) or not fix.get("codemod") or not rec.get("failure_key"):
            continue
        what = json.dumps([rec["failure_key"], fix.get("codemod"), fix.get("params")], sort_keys=True)
        if what not in seen:
            seen.add(what)
            out.append(rec)
    return out
