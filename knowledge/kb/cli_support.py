"""Plain functions behind `npuport kb build|search|stats` (the typer wiring lives in api/cli.py).

Each returns printable text, or a JSON-ready dict when ``json=True``; errors are KBError with a
message meant for the user.
"""

from __future__ import annotations

import importlib.util
import json as _json
import os
from pathlib import Path
from typing import Any

from knowledge.home import npuport_home
from knowledge.kb.kb import KnowledgeBase
from knowledge.kb.sources import DEFAULT_DOC_REPOS
from knowledge.settings import settings


def default_sources(home: Path | None = None) -> list[str]:
    """What `npuport kb build` reads when given no sources: what any user can get.

    - the torch_npu wheel (the installed one, else version NPUPORT_KB_TORCH_NPU from the package index):
      its custom-op docstrings;
    - op matrices in `<home>/matrices` (built from that wheel and op-plugin's tables by `npuport ops`):
      op facts, and the aten names of aclnn kernels;
    - the public CANN operator reference repositories (hicann/ops-*), cloned once into
      `<home>/cache/git` when the network allows (offline: the cache, or a note);
    - doc folders named in NPUPORT_KB_DOCS (os.pathsep-separated).
    Recipes, our runtime-failure notes and the port-memory journal are always added by the build itself.
    """
    home = home or npuport_home()
    conf = settings()
    wheel = "wheel:installed" if importlib.util.find_spec("torch_npu") else f"wheel:{conf.kb_torch_npu}"
    extra = [p for p in conf.kb_docs.split(os.pathsep) if p]
    return [
        wheel,
        *(f"matrix:{p}" for p in sorted((home / "matrices").glob("*.json"))),
        *DEFAULT_DOC_REPOS,
        *extra,
    ]


def optional_defaults() -> tuple[str, ...]:
    """Default sources whose absence (offline, no wheel) is a note, not a failure."""
    return (*DEFAULT_DOC_REPOS, f"wheel:{settings().kb_torch_npu}", "wheel:installed")


def kb_build(
    sources: list[str],
    json: bool = False,
    rebuild: bool = False,
    progress: bool = True,
    home: Path | None = None,
) -> str | dict[str, Any]:
    kb = KnowledgeBase(home)
    # named sources must exist (a typo fails loudly); the defaults are best effort
    stats = kb.build(
        list(sources) or default_sources(kb.home),
        progress=progress and not json,
        rebuild=rebuild,
        strict=True,
        optional=() if sources else optional_defaults(),
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
