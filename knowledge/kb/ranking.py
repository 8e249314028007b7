"""How a search ranks: what the dense half embeds, and the reciprocal-rank fusion of the identifier,
"about", BM25 and dense rankings (port memory first); and the build's progress bar."""

from __future__ import annotations

import re
from typing import Any

from knowledge.kb.models import Hit

QUERY_EMBED_CHARS = 120  # the dense half reads the head of a query (dev half: same recall as 240, ~35% less CPU)
RRF_K = 20  # reciprocal-rank constant: small, so the head of each ranking counts
ID_WEIGHT = 1.5
# a shared identifier (op, code, env var, library) is the strongest signal
ABOUT_KINDS = frozenset({"aclnn", "op", "api", "lib", "env"})

_PATHISH = re.compile(r"\S*[/\\]\S*")


def dense_text(query: str) -> str:
    """What the dense half embeds: paths (build/CMakeFiles/..., site-packages/...) carry no meaning for
    it, and a long log costs embedding time while identifiers and BM25 already read all of it."""
    text = " ".join(_PATHISH.sub(" ", query).split())
    return (text or query)[:QUERY_EMBED_CHARS]


def fuse_rank(hits: list[Hit], k: int, dense_rank: dict[str, int], lex_rank: dict[str, int]) -> list[Hit]:
    """Port memory first, then reciprocal-rank fusion of the identifier, BM25 and dense rankings."""

    def id_score(h: Hit) -> int:
        # a named op, code or library the chunk is about beats a hazard class the text hints at
        primary_n = sum(1 for m in h.matched if m in h.primary and not m.startswith("hz:"))
        return len(h.matched) + 2 * primary_n

    by_id = sorted((h for h in hits if h.matched), key=lambda h: (-id_score(h), -h.score))
    id_rank = {h.id: i for i, h in enumerate(by_id)}

    # Chunks *about* a name the query carries (an aclnn op, aten/custom op, runtime API, library or
    # variable in their title keys, counted twice; named in their text, once): a fourth ranking, so one
    # such page is not outvoted by chunks that merely mention a common code (every aclnn page lists 161002).
    def about_n(h: Hit) -> int:
        return sum(2 if m in h.primary else 1 for m in h.matched if m.split(":", 1)[0] in ABOUT_KINDS)

    about = sorted((h for h in hits if about_n(h)), key=lambda h: (-about_n(h), -id_score(h), -h.score))
    about_rank = {h.id: i for i, h in enumerate(about)}

    def fused(h: Hit) -> float:
        s = 0.0
        for ranks, w in ((id_rank, ID_WEIGHT), (about_rank, 1.0), (lex_rank, 1.0), (dense_rank, 1.0)):
            if h.id in ranks:
                s += w / (RRF_K + ranks[h.id])
        return s

    hits.sort(key=lambda h: (h.match != "memory", -fused(h)))
    out: list[Hit] = []
    seen_recipes: set[str] = set()
    for h in hits:
        if h.kind == "recipe":
            if h.source in seen_recipes:
                continue  # one hit per recipe: its best section
            seen_recipes.add(h.source)
            h = h.model_copy(update={"id": h.source, "anchor": "", "title": h.title.rsplit(" > ", 1)[0]})
        out.append(h)
        if len(out) == k:
            break
    return out


class _NoProgress:
    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *a: Any, **kw: Any) -> int:
        return 0

    def advance(self, *a: Any, **kw: Any) -> None:
        return None


def build_progress(enabled: bool) -> Any:
    if not enabled:
        return _NoProgress()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


MEMORY_MIN_SIM = 0.55  # a port-memory hit without shared identifiers must be at least this close


def _sim(distance: float) -> float:
    return max(0.0, min(1.0, 1.0 - float(distance)))


def hit_of(
cid: str, collection: str, doc: str, meta: dict[str, Any], dist: float | None, qkeys: list[str]
) -> Hit:
    mkeys = list(meta.get("keys") or [])
    matched = [q for q in qkeys if q in mkeys]
    sim = _sim(dist) if dist is not None else 0.0  # a lexical-only candidate has no distance
    if collection == "port_memory" and (matched or sim >= MEMORY_MIN_SIM):
        match = "memory"
    elif matched:
        match = "identifier"
    elif dist is None:
        match = "lexical"
    else:
        match = "dense"
    return Hit(
        id=cid,
        collection=collection,
        title=str(meta.get("title", "")),
        text=doc[:600],
        source=str(meta.get("source", "")),
        anchor=str(meta.get("anchor", "")),
        path=str(meta.get("path", "")),
        score=round(sim, 4),
        match=match,  # type: ignore[arg-type]
        matched=matched,
        keys=mkeys,
        primary=list(meta.get("primary") or []),
        version=str(meta.get("version", "")),
        product=str(meta.get("product", "")),
        language=str(meta.get("language", "")),
        kind=str(meta.get("kind", "")),
    )
