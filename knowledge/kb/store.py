"""Opening the Chroma store: a local persistent folder, or a server (NPUPORT_CHROMA_URL). chromadb is
imported here, on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from knowledge.errors import KBDependencyError, KBStoreError


def chromadb_module() -> Any:
    try:
        import chromadb
    except ImportError as e:
        raise KBDependencyError(
            f"The package 'chromadb' is needed for the knowledge base ({e}): pip install chromadb."
        ) from e
    return chromadb


def open_client(url: str | None, path: Path, rebuild_hint: str) -> Any:
    """A Chroma client for the server at ``url``, else for the persistent store in ``path``."""
    chromadb = chromadb_module()
    from chromadb.config import Settings

    settings = Settings(anonymized_telemetry=False, allow_reset=True)
    try:
        if url:
            u = urlparse(url if "://" in url else f"http://{url}")
            client = chromadb.HttpClient(
                host=u.hostname or "localhost",
                port=u.port or (443 if u.scheme == "https" else 8000),
                ssl=u.scheme == "https",
                settings=settings,
            )
            client.heartbeat()
            return client
        path.mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(path), settings=settings)
    except Exception as e:  # chromadb raises many types here: all mean "cannot use the store"
        if url:
            raise KBStoreError(f"Cannot reach the Chroma server at {url}: {e}") from e
        raise KBStoreError(f"The knowledge-base store at {path} cannot be opened ({e}); {rebuild_hint}.") from e
