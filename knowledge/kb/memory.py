"""Port memory as chunks: one validated fix (failure signature -> patch summary) per record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from knowledge.kb.identifiers import extract_keys, op_key
from knowledge.kb.models import Chunk


def memory_chunk(rec: dict[str, Any]) -> Chunk:
    text = (
        f"Failure: {rec['signature']}\nFix: {rec['patch_summary']}\nModel: {rec.get('model', '')}\n"
        f"Target: {rec.get('target', '')}\nDate: {rec.get('date', '')}"
    )
    if rec.get("hazard"):
        text += f"\nHazard: {rec['hazard']}"
    keys = extract_keys(f"{rec['signature']}\n{rec['patch_summary']}", hazards=True)
    for extra in [
        *(op_key(o) for o in rec.get("ops") or []),
        *([f"hz:{str(rec['hazard']).lower()}"] if rec.get("hazard") else []),
    ]:
        if extra not in keys:
            keys.append(extra)
    return Chunk(
        id=str(rec["id"]),
        collection="port_memory",
        title=f"Validated fix ({rec.get('model', '')} on {rec.get('target', '')}): "
        f"{str(rec['patch_summary'])[:80]}",
        text=text,
        embed_text=f"{rec['signature']}\n{rec['patch_summary']}"[:600],
        source=str(rec["id"]),
        path="port_memory.jsonl",
        keys=keys[:64],
        primary=keys[:64],
        version=str(rec.get("date", "")),
        kind="memory",
    )


def journal_records(path: Path | None = None, data: bytes | None = None) -> list[dict[str, Any]]:
    """The records of the port-memory journal (its bytes, or the file at ``path``; none when absent)."""
    if data is None:
        if path is None or not path.is_file():
            return []
        data = path.read_bytes()
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line from a crash: the rest still counts
        if isinstance(rec, dict) and rec.get("id") and rec.get("signature"):
            out.append(rec)
    return out


def journal_chunks(data: bytes) -> tuple[list[Chunk], str]:
    """The journal's records as chunks, one per id (a record appended twice counts once)."""
    seen: dict[str, Chunk] = {}
    for rec in journal_records(data=data):
        seen[str(rec["id"])] = memory_chunk(rec)
    return list(seen.values()), ""
