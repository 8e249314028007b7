"""Typed records of the knowledge base (pydantic only: importing them is cheap)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

COLLECTIONS = ("ascend_ops", "recipes", "serving", "port_memory")
Collection = Literal["ascend_ops", "recipes", "serving", "port_memory"]


class Chunk(BaseModel):
    """One unit of retrieval, before embedding."""

    id: str
    collection: Collection
    title: str
    text: str  # stored document (what a hit shows)
    embed_text: str  # what is embedded (short: the embedding model truncates anyway)
    source: str  # citation source, e.g. "torch_npu_docs/torch_npu-npu_rms_norm.md"
    path: str  # where it was read from (file, wheel member, ...)
    anchor: str = ""
    keys: list[str] = Field(default_factory=list)  # identifier keys (identifiers.extract_keys)
    primary: list[str] = Field(default_factory=list)  # keys named by the title: ranked higher
    version: str = ""
    product: str = ""
    language: str = "en"
    kind: str = "doc"  # doc | api | aclnn | wheel_doc | op_fact | recipe | memory
    extra: dict[str, str] = Field(default_factory=dict)  # more metadata (aclnn: the parsed dtype table)

    def metadata(self, source_key: str) -> dict[str, Any]:
        md: dict[str, Any] = {
            "source_key": source_key,
            "title": self.title[:300],
            "source": self.source,
            "path": self.path,
            "anchor": self.anchor,
            "version": self.version,
            "product": self.product[:300],
            "language": self.language,
            "kind": self.kind,
        }
        md.update(self.extra)
        # Chroma rejects empty lists in metadata: only set the key lists when present.
        if self.keys:
            md["keys"] = self.keys
        if self.primary:
            md["primary"] = self.primary
        return md


class SkippedFile(BaseModel):
    path: str
    reason: str


class BuildStats(BaseModel):
    sources: int = 0  # source files seen
    unchanged: int = 0
    added: int = 0
    updated: int = 0
    removed: int = 0
    chunks_added: int = 0
    chunks_removed: int = 0
    skipped: list[SkippedFile] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)  # e.g. "decoded as gb18030"
    seconds: float = 0.0
    embed_seconds: float = 0.0
    embedder: str = ""
    collections: dict[str, int] = Field(default_factory=dict)


class Hit(BaseModel):
    """One search result, with what is needed to cite it."""

    id: str
    collection: str
    title: str
    text: str  # excerpt
    source: str
    anchor: str = ""
    path: str = ""
    score: float  # cosine similarity of the query and the chunk, 0..1 (higher is closer)
    match: Literal["memory", "identifier", "lexical", "dense"] = "dense"
    matched: list[str] = Field(default_factory=list)  # identifier keys shared with the query
    keys: list[str] = Field(default_factory=list)
    primary: list[str] = Field(default_factory=list)  # keys named by the chunk's title
    version: str = ""
    product: str = ""
    language: str = ""
    kind: str = ""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cite(self) -> str:
        """One-line citation: `source#anchor`."""
        return f"{self.source}#{self.anchor}" if self.anchor else self.source

    def citation(self) -> dict[str, str]:
        """Fields of agents.models.Citation (knowledge must not import agents)."""
        return {"source": self.cite, "title": self.title, "excerpt": self.text[:400]}
