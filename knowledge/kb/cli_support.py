"""Plain functions behind `npuport kb build|search|stats` (the typer wiring lives in api/cli.py).

Each returns printable text, or a JSON-ready dict when ``json=True``; errors are KBError with a
message meant for the user.
"""

from __future__ import annotations

import json as _json
from pathlib import Path
from typing import Any

from knowledge.home import npuport_home
from knowledge.kb.kb import KnowledgeBase


def default_sources(home: Path | None = None) -> list[str]:
    """What `npuport kb build` reads when given no sources: op matrices in the home.

    Recipes and the port-memory journal are always added by the build itself.
    """
    home = home or npuport_home()
    return [f"matrix:{p}" for p in sorted((home / "matrices").glob("*.json"))]


def kb_build(
    sources: list[str],
    json: bool = False,
    rebuild: bool = False,
    progress: bool = True,
    home: Path | None = None,
) -> str | dict[str, Any]:
    kb = KnowledgeBase(home)
    stats = kb.build(
        list(sources) or default_sources(kb.home), progress=progress and not json, rebuild=rebuild
    )
    if json:
        return stats.model_dump()
    lines = [
        f"Knowledge base at {kb.location} ({stats.embedder or 'no embedding needed'})",
        f"  source files: {stats.sources} (unchanged {stats.unchanged}, added {stats.added}, "
        f"updated {stats.updated}, removed {stats.removed})",
        f"  chunks: +{stats.chunks_added} -{stats.chunks_removed}; "
        + ", ".join(f"{k} {v}" for k, v in stats.collections.items()),
        f"  time: {stats.seconds:.1f}s (embedding {stats.embed_seconds:.1f}s)",
    ]
    lines += [f"  skipped {s.path}: {s.reason}" for s in stats.skipped]
    lines += [f"  note: {n}" for n in stats.notes]
    return "\n".join(lines)


def kb_search(
    query: str, k: int = 5, json: bool = False, collections: list[str] | None = None, home: Path | None = None
) -> str | list[dict[str, Any]]:
    hits = KnowledgeBase(home).search(query, k=k, collections=collections)
    if json:
        return [h.model_dump() for h in hits]
    if not hits:
        return "No hits (is the knowledge base built? run `npuport kb build`)."
    out = []
    for i, h in enumerate(hits, 1):
        why = f"{h.match}: {', '.join(h.matched)}" if h.matched else h.match
        excerpt = " ".join(h.text.split())[:240]
        out.append(f"{i}. [{h.score:.2f} {why}] {h.title}\n   {h.cite}\n   {excerpt}")
    return "\n".join(out)


def kb_stats(json: bool = False, home: Path | None = None) -> str | dict[str, Any]:
    stats = KnowledgeBase(home).stats()
    if json:
        return stats
    return _json.dumps(stats, indent=2, ensure_ascii=False)
