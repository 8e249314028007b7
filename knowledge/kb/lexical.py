"""BM25 over every stored chunk: the lexical half of hybrid search.

Error messages are mostly exact strings ("synchronize stream failed", "Tried to allocate", a library name),
which dense MiniLM vectors blur; BM25 ranks them by the rare words they share. Small and in memory: the
index is built from the store on the first search after a build (a second or two for ~10k chunks) and
looked up through an inverted index, so a query costs a few milliseconds rather than a pass over all chunks.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_WORD = re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)*")
_CJK = re.compile(r"[\u4e00-\u9fff]+")
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "at",
        "is",
        "are",
        "was",
        "be",
        "by",
        "for",
        "and",
        "or",
        "not",
        "with",
        "as",
        "it",
        "this",
        "that",
        "from",
        "no",
        "can",
        "use",
        "error",
        "errors",
        "failed",
        "fail",
        "runtimeerror",
        "traceback",
        "file",
        "line",
        "most",
        "recent",
        "call",
        "last",
    ]
)
K1 = 1.2
B = 0.75


def tokens(text: str) -> list[str]:
    """Lower-case words (dotted names kept whole and split), and CJK character bigrams."""
    low = text.lower().replace("\\_", "_")
    out: list[str] = []
    for m in _WORD.finditer(low):
        w = m.group(0)
        parts = w.split(".") if "." in w else []
        for t in (w, *parts):
            if len(t) > 1 and t not in _STOP and not t.isdigit() or (t.isdigit() and len(t) >= 4):
                out.append(t)
    for m in _CJK.finditer(text):
        s = m.group(0)
        out.extend(s[i : i + 2] for i in range(max(1, len(s) - 1)))
    return out


@dataclass
class Doc:
    id: str
    collection: str
    text: str
    meta: dict[str, Any]


@dataclass
class BM25Index:
    docs: list[Doc] = field(default_factory=list)
    postings: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # term -> [(doc, tf)]
    lengths: list[int] = field(default_factory=list)
    avg_len: float = 1.0
    by_key: dict[str, list[int]] = field(default_factory=dict)  # identifier key -> docs (metadata "keys")
    # collection -> (unit vectors as a float32 matrix, row -> doc index): the dense half, searched exactly
    dense: dict[str, tuple[Any, list[int]]] = field(default_factory=dict)

    @classmethod
    def build(cls, docs: list[Doc]) -> BM25Index:
        idx = cls(docs=docs)
        for i, d in enumerate(docs):
            toks = tokens(f"{d.meta.get('title', '')}\n{d.text}")
            idx.lengths.append(len(toks))
            for t, n in Counter(toks).items():
                idx.postings.setdefault(t, []).append((i, n))
            for key in d.meta.get("keys") or []:
                idx.by_key.setdefault(str(key), []).append(i)
        idx.avg_len = (sum(idx.lengths) / len(idx.lengths)) if idx.lengths else 1.0
        return idx

    def set_vectors(self, vectors: dict[str, list[Any]]) -> None:
        """Attach each collection's stored embeddings (in the order its docs were added)."""
        import numpy as np

        rows: dict[str, list[int]] = {}
        for i, d in enumerate(self.docs):
            rows.setdefault(d.collection, []).append(i)
        self.dense = {}
        for name, vecs in vectors.items():
            idx = rows.get(name, [])
            if not len(vecs) or len(vecs) != len(idx):
                continue
            mat = np.asarray(vecs, dtype=np.float32)
            norms = np.linalg.norm(mat, axis=1, keepdims=True)
            self.dense[name] = (mat / np.where(norms > 0, norms, 1.0), idx)

    def nearest(self, qvec: list[float], collection: str, k: int) -> list[tuple[Doc, float]]:
        """The ``k`` docs of ``collection`` closest to ``qvec`` by cosine similarity, best first."""
        import numpy as np

        if collection not in self.dense or k <= 0:
            return []
        mat, idx = self.dense[collection]
        q = np.asarray(qvec, dtype=np.float32)
        q = q / (float(np.linalg.norm(q)) or 1.0)
        sims = mat @ q
        k = min(k, len(idx))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(idx) else np.arange(len(idx))
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(self.docs[idx[j]], float(sims[j])) for j in top]

    def with_keys(
        self, keys: list[str], k: int, collections: set[str] | None, tiebreak: dict[int, float]
    ) -> list[Doc]:
        """Docs sharing identifier keys with a query: most shared first (keys the doc's title names
        count three times, hazard hints once), then by ``tiebreak`` (BM25 score)."""
        score: dict[int, int] = {}
        for key in keys:
            for i in self.by_key.get(key, ()):
                prim = self.docs[i].meta.get("primary") or []
                score[i] = score.get(i, 0) + (3 if key in prim and not key.startswith("hz:") else 1)
        ranked = sorted(score, key=lambda i: (-score[i], -tiebreak.get(i, 0.0)))
        out = [self.docs[i] for i in ranked if collections is None or self.docs[i].collection in collections]
        return out[:k]

    def scores(self, query: str) -> dict[int, float]:
        n = len(self.docs)
        scores: dict[int, float] = {}
        if not n:
            return scores
        for t in set(tokens(query)):
            plist = self.postings.get(t)
            if not plist or (n >= 50 and len(plist) > n * 0.3):  # in a third of a store: says nothing
                continue
            idf = math.log(1 + (n - len(plist) + 0.5) / (len(plist) + 0.5))
            for i, tf in plist:
                norm = tf * (K1 + 1) / (tf + K1 * (1 - B + B * self.lengths[i] / self.avg_len))
                scores[i] = scores.get(i, 0.0) + idf * norm
        return scores

    def search(self, query: str, k: int, collections: set[str] | None = None) -> list[tuple[Doc, float]]:
        return self.rank(self.scores(query), k, collections)

    def rank(self, scores: dict[int, float], k: int, collections: set[str] | None) -> list[tuple[Doc, float]]:
        ranked = sorted(scores.items(), key=lambda x: -x[1])
        out: list[tuple[Doc, float]] = []
        for i, s in ranked:
            d = self.docs[i]
            if collections is None or d.collection in collections:
                out.append((d, s))
                if len(out) == k:
                    break
        return out
