"""The npuport home: where matrices, caches, the Chroma store and checkpoints live."""

from __future__ import annotations

import os
from pathlib import Path


def npuport_home() -> Path:
    """``$NPUPORT_HOME`` or ``~/.npuport``; created on first use."""
    home = Path(os.environ.get("NPUPORT_HOME") or Path.home() / ".npuport").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def cache_dir(name: str) -> Path:
    d = npuport_home() / name
    d.mkdir(parents=True, exist_ok=True)
    return d
