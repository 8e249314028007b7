"""The npuport home: where matrices, caches, the Chroma store and checkpoints live."""

from __future__ import annotations

from pathlib import Path

from knowledge.settings import settings


def npuport_home() -> Path:
    """``$NPUPORT_HOME`` or ``~/.npuport``; created on first use."""
    return settings().resolved_home()


def cache_dir(name: str) -> Path:
    d = npuport_home() / name
    d.mkdir(parents=True, exist_ok=True)
    return d
