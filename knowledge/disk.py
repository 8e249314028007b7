"""Free disk space, and failed writes explained by its lack.

A port writes layered environments (hundreds of MB each), workspaces and shrunk checkpoints. When the disk
fills, the failures come back as something else: torch.save's zip writer says ``unexpected pos A vs B``
after a short write, pip exits 1 with little to say. A run that failed that way says so, with the figure.
"""

from __future__ import annotations

import shutil
from pathlib import Path

LOW_FREE_BYTES = 2 * 1024**3  # below this, a port of a real release (environments, shrunk weights) may not fit
# What a write that ran out of space looks like from Python, torch's zip writer, safetensors and pip.
SHORT_WRITE_SIGNS = ("No space left on device", "Errno 28", "os error 28", "unexpected pos ", "Disk quota exceeded",
                     "Errno 122")


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def low_disk_note(path: Path, floor: int | None = None) -> str | None:
    """A sentence when the disk holding ``path`` has less than ``floor`` (LOW_FREE_BYTES) bytes free, else None."""
    free = free_bytes(path)
    if free >= (LOW_FREE_BYTES if floor is None else floor):
        return None
    return f"only {free / 2**20:.0f} MiB free on the disk holding {path}"


def explain_write_failure(message: str, path: Path) -> str | None:
    """Why a failure that looks like a short write happened, when the disk holding ``path`` is (nearly) full."""
    if not any(sign in message for sign in SHORT_WRITE_SIGNS):
        return None
    note = low_disk_note(path)
    return f"a write failed for lack of disk space ({note}): free some and resume" if note else None
