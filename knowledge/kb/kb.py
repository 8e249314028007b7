"""The knowledge base: Chroma collections, incremental ingestion, op-aware search, port memory.

chromadb, rich and the embedding model are imported on first use (graph/api import this package
indirectly and must stay light).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import time
from collections.abc import Iterable
from datetime import date as _date
from pathlib import Path
from typing import Any

from knowledge.errors import KBError, KBStoreError
from knowledge.home import npuport_home
from knowledge.kb.chunking import digest
from knowledge.kb.embeddings import Embedder, embedder_from_setting
from knowledge.kb.identifiers import extract_keys
from knowledge.kb.lexical import BM25Index, Doc
from knowledge.kb.memory import journal_chunks, journal_records, memory_chunk
from knowledge.kb.models import (
    COLLECTIONS,
    BuildStats,
    Chunk,
    Hit,
    SkippedFile,
)
from knowledge.kb.ranking import build_progress, dense_text, fuse_rank, hit_of
from knowledge.kb.recipes import load_recipes, recipe_keys_for, recipe_load
from knowledge.kb.sources import (
    CHUNKER_VERSION,
    Resolved,
    SourceUnit,
    resolve,
    resolve_folder,
    sha256_bytes,
)
from knowledge.kb.store import open_client
from knowledge.settings import settings

FACTS_DIR = Path(__file__).resolve().parents[1] / "facts"
MANIFEST = "kb_manifest"
META_ID = "__kb__"
SCHEMA = 1
EMBED_BATCH = 512
SMALL_COLLECTION = 300  # collections up to this size are ranked whole: one query instead of two
LEXICAL_K = 30  # BM25 candidates fused with the dense and identifier rankings
QUERY_CACHE = 256  # query embeddings kept per KnowledgeBase
REBUILD_HINT = "run `npuport kb build --rebuild` to recreate it"


class KnowledgeBase:
    """`KnowledgeBase(home=None)`: the store under `<home>/chroma`, or the server in NPUPORT_CHROMA_URL."""

    def __init__(
        self, home: str | Path | None = None, *, url: str | None = None, embeddings: str | None = None
    ) -> None:
        self.home = Path(home).expanduser() if home is not None else npuport_home()
        self.home.mkdir(parents=True, exist_ok=True)
        self.url = url if url is not None else (settings().chroma_url or None)
        self._embeddings_setting = embeddings
        self._embedder: Embedder | None = None
        self._client: Any = None
        self._counts: dict[str, int] = {}
        self._bm25: BM25Index | None = None
        self._qcache: dict[str, list[float]] = {}

    # ------------------------------------------------------------------ plumbing

    @property
    def chroma_path(self) -> Path:
        return self.home / "chroma"

    @property
    def journal_path(self) -> Path:
        return self.home / "port_memory.jsonl"

    @property
    def location(self) -> str:
        return self.url or str(self.chroma_path)

    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = embedder_from_setting(self._embeddings_setting)
        return self._embedder

    def client(self) -> Any:
        if self._client is None:
            self._client = open_client(self.url, self.chroma_path, REBUILD_HINT)
        return self._client

    def _collection(self, name: str) -> Any:
        try:
            return self.client().get_or_create_collection(
                name, configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
            )
        except KBError:
            raise
        except Exception as e:
            raise KBStoreError(
                f"The knowledge-base store at {self.location} is unreadable "
                f"(collection {name}: {e}); {REBUILD_HINT}."
            ) from e

    def _manifest(self) -> dict[str, dict[str, Any]]:
        col = self._collection(MANIFEST)
        try:
            got = col.get(include=["metadatas"])
        except Exception as e:
            raise KBStoreError(
                f"The knowledge-base store at {self.location} is unreadable ({e}); {REBUILD_HINT}."
            ) from e
        return {i: dict(m or {}) for i, m in zip(got["ids"], got["metadatas"] or [], strict=False)}

    def _set_manifest(self, key: str, meta: dict[str, Any]) -> None:
        self._collection(MANIFEST).upsert(ids=[key], embeddings=[[1.0]], metadatas=[meta])

    def _check_embedder(self, manifest: dict[str, dict[str, Any]]) -> None:
        meta = manifest.get(META_ID)
        name = self.embedder().name
        if meta and meta.get("embedder") != name:
            raise KBStoreError(
                f"The store at {self.location} was built with embeddings "
                f"'{meta.get('embedder')}' but '{name}' is configured; {REBUILD_HINT}."
            )

    def reset(self) -> None:
        """Drop the whole store (port memory survives: its journal is re-ingested by the next build)."""
        if self.url:
            client = self.client()
            for name in [*COLLECTIONS, MANIFEST]:
                with contextlib.suppress(Exception):  # absent: nothing to drop
                    client.delete_collection(name)
        else:
            # Embedded Chroma caches one system per path: drop it before deleting the files, or a
            # later client would write into the deleted store.
            self._client = None
            with contextlib.suppress(ImportError):
                from chromadb.api.client import SharedSystemClient

                SharedSystemClient.clear_system_cache()
            shutil.rmtree(self.chroma_path, ignore_errors=True)
        self._counts.clear()
        self._bm25 = None

    # ------------------------------------------------------------------ build

    def _builtin_units(self, out: Resolved) -> None:
        for r in load_recipes():
            data = Path(r.path).read_bytes()
            out.units.append(
                SourceUnit(
                    f"recipes::{Path(r.path).name}",
                    "recipes",
                    r.path,
                    sha256_bytes(data),
                    "recipes",
                    functools.partial(recipe_load, r),
                )
            )
        out.roots.append("recipes")
        # our own runtime-failure notes (stream sync, OOM, libraries, HCCL ...): always in the store
        resolve_folder(FACTS_DIR, "ascend_ops", out)
        out.roots.append("memory")
        if self.journal_path.is_file():
            data = self.journal_path.read_bytes()
            out.units.append(
                SourceUnit(
                    "memory::journal",
                    "memory",
                    str(self.journal_path),
                    sha256_bytes(data),
                    "port_memory",
                    lambda: journal_chunks(data),
                )
            )

    def build(
        self,
        sources: list[str],
        progress: bool = True,
        rebuild: bool = False,
        *,
        strict: bool = False,
        optional: tuple[str, ...] = (),
    ) -> BuildStats:
        """Ingest ``sources`` (see knowledge.kb.sources) plus our recipes and the port-memory journal.

        Incremental: a source file whose content hash is unchanged costs nothing; a changed one has
        its chunks replaced; files gone from a folder source are pruned.
        """
        t0 = time.perf_counter()
        if rebuild:
            self.reset()
        resolved = resolve(sources, strict=strict, optional=optional)
        self._builtin_units(resolved)
        stats = BuildStats(
            skipped=list(resolved.skipped), notes=list(resolved.notes), sources=len(resolved.units)
        )
        manifest = self._manifest()
        keys = {u.key for u in resolved.units}
        todo = [
            u
            for u in resolved.units
            if (manifest.get(u.key, {}).get("sha256"), manifest.get(u.key, {}).get("chunker"))
            != (u.sha256, CHUNKER_VERSION)
        ]
        stats.unchanged = len(resolved.units) - len(todo)
        prunable = set(resolved.roots)
        gone = [
            k for k, m in manifest.items() if k != META_ID and m.get("root") in prunable and k not in keys
        ]
        for k in gone:
            stats.chunks_removed += self._delete_source(k, manifest[k])
            self._collection(MANIFEST).delete(ids=[k])
            stats.removed += 1
        if todo:
            self._check_embedder(manifest)
            self._ingest(todo, manifest, stats, progress)
        stats.embedder = manifest.get(META_ID, {}).get("embedder", "") or (
            self.embedder().name if todo else ""
        )
        stats.collections = self.counts()
        stats.seconds = round(time.perf_counter() - t0, 2)
        return stats

    def _delete_source(self, key: str, meta: dict[str, Any]) -> int:
        col = self._collection(str(meta.get("collection", "ascend_ops")))
        n = int(meta.get("chunks", 0))
        col.delete(where={"source_key": key})
        return n

    def _ingest(
        self, todo: list[SourceUnit], manifest: dict[str, dict[str, Any]], stats: BuildStats, progress: bool
    ) -> None:
        loaded: list[tuple[SourceUnit, list[Chunk]]] = []
        with build_progress(progress) as bar:
            task = bar.add_task("Reading sources", total=len(todo))
            for u in todo:
                try:
                    chunks, note = u.load()
                except KBError as e:
                    stats.skipped.append(SkippedFile(path=u.path, reason=str(e)))
                    bar.advance(task)
                    continue
                if note:
                    stats.notes.append(note)
                loaded.append((u, chunks))
                bar.advance(task)
            texts = [c.embed_text for _, chunks in loaded for c in chunks]
            emb = self.embedder()
            vectors: list[list[float]] = []
            t = time.perf_counter()
            task = bar.add_task(f"Embedding {len(texts)} chunks ({emb.name})", total=len(texts))
            for i in range(0, len(texts), EMBED_BATCH):
                batch = texts[i : i + EMBED_BATCH]  # a few batches per call: progress, bounded memory
                vectors.extend(emb.embed_documents(batch))
                bar.advance(task, len(batch))
            stats.embed_seconds = round(time.perf_counter() - t, 2)
        if META_ID not in manifest:
            self._set_manifest(META_ID, {"embedder": emb.name, "schema": SCHEMA, "root": "", "sha256": ""})
            manifest[META_ID] = {"embedder": emb.name}
        # Writes are batched per collection (one sqlite commit per batch, not per file). A crash
        # before the manifest write only means the next build redoes these files.
        stale: dict[str, list[str]] = {}
        for u, _ in loaded:
            old = manifest.get(u.key)
            if old:
                stale.setdefault(str(old.get("collection", "ascend_ops")), []).append(u.key)
                stats.chunks_removed += int(old.get("chunks", 0))
                stats.updated += 1
            else:
                stats.added += 1
        for name, keys in stale.items():
            self._collection(name).delete(where={"source_key": {"$in": keys}})
        by_col: dict[str, list[tuple[Chunk, list[float], str]]] = {}
        pos = 0
        for u, chunks in loaded:
            for c, v in zip(chunks, vectors[pos : pos + len(chunks)], strict=True):
                by_col.setdefault(u.collection, []).append((c, v, u.key))
            pos += len(chunks)
            stats.chunks_added += len(chunks)
        max_batch = self._max_batch()
        for name, rows in by_col.items():
            col = self._collection(name)
            for i in range(0, len(rows), max_batch):
                part = rows[i : i + max_batch]
                col.upsert(
                    ids=[c.id for c, _, _ in part],
                    embeddings=[v for _, v, _ in part],
                    documents=[c.text for c, _, _ in part],
                    metadatas=[c.metadata(key) for c, _, key in part],
                )
        if loaded:
            self._collection(MANIFEST).upsert(
                ids=[u.key for u, _ in loaded],
                embeddings=[[1.0]] * len(loaded),
                metadatas=[
                    {
                        "sha256": u.sha256,
                        "chunker": CHUNKER_VERSION,
                        "root": u.root,
                        "collection": u.collection,
                        "chunks": len(chunks),
                        "path": u.path,
                    }
                    for u, chunks in loaded
                ],
            )
        self._counts.clear()
        self._bm25 = None

    def _max_batch(self) -> int:
        try:
            return max(1, min(5000, int(self.client().get_max_batch_size())))
        except Exception:
            return 1000

    # ------------------------------------------------------------------ search

    def counts(self) -> dict[str, int]:
        if not self._counts:
            self._counts = {name: self._collection(name).count() for name in COLLECTIONS}
        return dict(self._counts)

    def lexical(self) -> BM25Index:
        """The in-memory index of every stored chunk: BM25 postings, identifier keys and the chunks'
        vectors (built on first use after a build, in one read of each collection)."""
        if self._bm25 is None:
            docs: list[Doc] = []
            vectors: dict[str, list[Any]] = {}
            for name in COLLECTIONS:
                if not self.counts().get(name):
                    continue
                got = self._collection(name).get(include=["documents", "metadatas", "embeddings"])
                embs = got.get("embeddings")
                embs = [] if embs is None else list(embs)
                for cid, doc, meta in zip(got["ids"], got["documents"] or [], got["metadatas"] or [], strict=False):
                    docs.append(Doc(cid, name, doc or "", dict(meta or {})))
                vectors[name] = embs
            self._bm25 = BM25Index.build(docs)
            self._bm25.set_vectors(vectors)
        return self._bm25

    def search(self, query: str, k: int = 5, collections: Iterable[str] | None = None) -> list[Hit]:
        """Top ``k`` hits: relevant port-memory first, then the fusion (reciprocal rank) of three rankings:
        chunks sharing identifiers with the query (op names, error codes, env vars, libraries, hazard ids),
        BM25 over the words, and dense neighbours."""
        names = list(collections) if collections else list(COLLECTIONS)
        unknown = [n for n in names if n not in COLLECTIONS]
        if unknown:
            raise KBError(f"Unknown collections {unknown}; choose from {list(COLLECTIONS)}.")
        counts = self.counts()
        names = [n for n in names if counts.get(n, 0) > 0]
        if not names or not query.strip():
            return []
        keys = extract_keys(query, hazards=True)
        keys += [hk for hk in recipe_keys_for(query) if hk not in keys]
        try:
            lex = self.lexical()
        except KBError:
            raise
        except Exception as e:
            raise KBStoreError(f"Search failed on {self.location} ({e}); {REBUILD_HINT}.") from e
        qvec = self._query_vector(dense_text(query))
        cands: dict[str, Hit] = {}
        # Dense: exact cosine over the in-memory vectors (no store round trip per query); small
        # collections ranked whole, large ones to 3k.
        for name in names:
            n = counts[name]
            for d, sim in lex.nearest(qvec, name, n if n <= SMALL_COLLECTION else min(n, 3 * k)):
                cands[d.id] = hit_of(d.id, name, d.text, d.meta, 1.0 - sim, keys)
        dense_rank = {h.id: i for i, h in enumerate(sorted(cands.values(), key=lambda h: -h.score))}
        # Lexical (BM25) and identifier candidates come from the same in-memory index.
        bm = lex.scores(query)
        wanted = set(names)
        lex_rank: dict[str, int] = {}
        for i, (d, _) in enumerate(lex.rank(bm, LEXICAL_K, wanted)):
            lex_rank[d.id] = i
            if d.id not in cands:
                cands[d.id] = hit_of(d.id, d.collection, d.text, d.meta, None, keys)
        for d in lex.with_keys(keys, 4 * k, wanted, bm):
            if d.id not in cands:
                cands[d.id] = hit_of(d.id, d.collection, d.text, d.meta, None, keys)
        return fuse_rank(list(cands.values()), k, dense_rank, lex_rank)

    def _query_vector(self, text: str) -> list[float]:
        """The query's embedding; repeated queries (a debugger retrying one failure) are not re-embedded."""
        vec = self._qcache.get(text)
        if vec is None:
            vec = self.embedder().embed_query(text)
            if len(self._qcache) >= QUERY_CACHE:
                self._qcache.pop(next(iter(self._qcache)))
            self._qcache[text] = vec
        return vec

    def aclnn_record(self, key: str) -> tuple[dict[str, Any], str] | None:
        """The parsed CANN reference record (names, ops, products, per-chip dtypes) of the doc keyed by
        ``key`` (`aclnn:aclnnadd` or `op:add_`), with its citation; None when the store has none."""
        if not self.counts().get("ascend_ops"):
            return None
        got = self._collection("ascend_ops").get(
            where={"$and": [{"kind": "aclnn"}, {"keys": {"$contains": key}}]}, include=["metadatas"]
        )
        for meta in got["metadatas"] or []:
            raw = (meta or {}).get("aclnn")
            if raw:
                rec = json.loads(str(raw))
                if key.startswith("op:") and key[3:] not in rec.get("ops", []):
                    continue
                return rec, str(meta.get("source", ""))
        return None

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        manifest = self._manifest()
        roots: dict[str, int] = {}
        for key, m in manifest.items():
            if key != META_ID:
                roots[str(m.get("root"))] = roots.get(str(m.get("root")), 0) + 1
        return {
            "store": self.location,
            "embedder": manifest.get(META_ID, {}).get("embedder", ""),
            "collections": self.counts(),
            "source_files": sum(roots.values()),
            "roots": roots,
        }

    # ------------------------------------------------------------------ port memory

    def record_fix(
        self,
        signature: str,
        patch_summary: str,
        model: str,
        target: str,
        *,
        hazard: str | None = None,
        ops: list[str] | None = None,
        files: list[str] | None = None,
        date: str | None = None,
    ) -> str:
        """Remember a fix that led to a validated port; returns its id ("memory:<hash>").

        The record is appended to `<home>/port_memory.jsonl` (survives rebuilds) and indexed at once.
        """
        if not signature.strip() or not patch_summary.strip():
            raise KBError("record_fix needs a failure signature and a patch summary")
        rec = {
            "id": "memory:" + digest(signature, patch_summary, model, target),
            "signature": signature,
            "patch_summary": patch_summary,
            "model": model,
            "target": target,
            "hazard": hazard or "",
            "ops": list(ops or []),
            "files": list(files or []),
            "date": date or _date.today().isoformat(),
        }
        existing = journal_records(self.journal_path)
        if not any(r.get("id") == rec["id"] for r in existing):
            with self.journal_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        chunk = memory_chunk(rec)
        data = self.journal_path.read_bytes()
        manifest = self._manifest()
        self._check_embedder(manifest)
        emb = self.embedder()
        if META_ID not in manifest:
            self._set_manifest(META_ID, {"embedder": emb.name, "schema": SCHEMA, "root": "", "sha256": ""})
        self._collection("port_memory").upsert(
            ids=[chunk.id],
            embeddings=emb.embed_documents([chunk.embed_text]),
            documents=[chunk.text],
            metadatas=[chunk.metadata("memory::journal")],
        )
        n = len(existing) + (0 if any(r.get("id") == rec["id"] for r in existing) else 1)
        self._set_manifest(
            "memory::journal",
            {
                "sha256": sha256_bytes(data),
                "chunker": CHUNKER_VERSION,
                "root": "memory",
                "collection": "port_memory",
                "chunks": n,
                "path": str(self.journal_path),
            },
        )
        self._counts.clear()
        self._bm25 = None
        return str(rec["id"])
