"""The port memory's journal, ``<home>/port_memory.jsonl``: fixes that led to validated ports, one JSON
record a line. It is the knowledge base's port-memory source (knowledge/kb indexes it into Chroma when
a store exists) and it is written with or without a store, so what one port learned (a fix no recipe
covered, e.g. an LLM's edit) is there for the next port, in the same batch or later.

Writers serialize on one home lock (``WRITE_LOCK``, an fcntl lock: it holds between any processes
on this machine, Ray workers included, and the kernel drops it when a holder dies). On a multi-node Ray
cluster the home must be a shared folder whose file system honours flock."""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from knowledge.home import npuport_home
from knowledge.kb.chunking import digest

JOURNAL = "port_memory.jsonl"
WRITE_LOCK = "knowledge-base"  # knowledge.locks.home_lock name shared by every knowledge-base writer


# Whose ports write and read the memory: the service sets the job's owner (its token's), a batch its
# batch's owner; a port run from the CLI is "local". What a fix is made of decides whether it is reused:
# one of npuport's own rules (a codemod the rule policy chose) is reused for its owner; an LLM's edit was
# written from text the model printed (its exception, its traceback), so a hostile model can steer it: it is
# journalled as a candidate and reused by nobody, its owner included, until a person reviewed it
# (``review_record``, ``npuport kb review ID``); then by every owner.
LOCAL_OWNER = "local"
_owner: contextvars.ContextVar[str] = contextvars.ContextVar("npuport_memory_owner", default=LOCAL_OWNER)


@contextlib.contextmanager
def memory_owner(owner: str) -> Iterator[None]:
    token = _owner.set(owner or LOCAL_OWNER)
    try:
        yield
    finally:
        _owner.reset(token)


def current_owner() -> str:
    return _owner.get()


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
    rec = {**rec, "owner": rec.get("owner") or current_owner()}
    # provenance: what made the fix (an LLM's edit, a rule) and that nobody has reviewed it yet
    rec["provenance"] = {"by": (rec.get("fix") or {}).get("by") or "npuport", "model": rec.get("model", ""),
                         "reviewed_by": None, **(rec.get("provenance") or {})}
    path = journal_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return True


RULE_PROVENANCE = "npuport"
"""``provenance.by`` of a fix npuport's own rules made (any other maker, "llm", needs a review)."""


def reusable_by(rec: dict[str, Any], owner: str) -> bool:
    """Whether ``owner``'s ports may reuse ``rec``: one a person reviewed, or its own records made by npuport's
    rules. An LLM's edit (its maker read the model's own error text) waits for a review, whoever's it is; a
    record without an owner (written before owners were kept) has no provenance and is not reused."""
    prov = rec.get("provenance") or {}
    if prov.get("reviewed_by"):
        return True
    return prov.get("by") == RULE_PROVENANCE and bool(rec.get("owner")) and rec.get("owner") == owner


def review_record(record_id: str, reviewer: str, home: Path | None = None) -> bool:
    """Mark a record reviewed by ``reviewer`` (then every owner's ports may reuse it). The caller holds
    ``home_lock(WRITE_LOCK)``. False when there is no such record."""
    records = read_records(home)
    found = False
    for rec in records:
        if rec["id"] == record_id:
            rec["provenance"] = {**(rec.get("provenance") or {}), "reviewed_by": reviewer}
            found = True
    if found:
        path = journal_path(home)
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        tmp.replace(path)
    return found


def learned_fixes(home: Path | None = None, owner: str | None = None) -> list[dict[str, Any]]:
    """Records that carry an actionable fix (``fix``: codemod and params) and the ``failure_key`` it
    fixed, one per distinct fix, oldest first; only those ``owner`` (the current one by default) may
    reuse (``reusable_by``)."""
    who = owner if owner is not None else current_owner()
    seen: set[str] = set()
    out = []
    for rec in read_records(home):
        if not reusable_by(rec, who):
            continue
        fix = rec.get("fix")
        if not isinstance(fix, dict) or not fix.get("codemod") or not rec.get("failure_key"):
            continue
        what = json.dumps([rec["failure_key"], fix.get("codemod"), fix.get("params")], sort_keys=True)
        if what not in seen:
            seen.add(what)
            out.append(rec)
    return out
