"""Fair shares of the service between its tokens (docs/security.md, "Shares"): one owner cannot fill the
queue, take every worker, or fill the disk with uploads; a run's memory is capped as a whole or the service
does not run ports at all. api/jobs.py asks these at submit and before a job starts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from knowledge.errors import JobError
from knowledge.settings import ServiceSettings as Settings


def running_cap(settings: Settings) -> int:
    return settings.max_running_per_owner or max(1, settings.workers // 2)


def check_queue(store: Any, settings: Settings, owner: str) -> None:
    """Refuse (429) a job beyond the service's queue or this owner's share of it."""
    if store.count(("queued",)) >= settings.max_queued:
        raise JobError(f"the queue is full ({settings.max_queued} jobs waiting); try later", 429)
    if store.count(("queued",), owner=owner) >= settings.max_queued_per_owner:
        raise JobError(f"this token has {settings.max_queued_per_owner} jobs waiting already (its share of the "
                       "queue); try when one has started", 429)


def may_start(store: Any, settings: Settings, owner: str) -> bool:
    """Whether one more job of ``owner`` may run now (its running share)."""
    return store.count(("running",), owner=owner) < running_cap(settings)


def memory_problem(settings: Settings) -> str:
    """Why the service may not run ports here ("" when it may): a run's memory must be capped as a whole."""
    from sandbox.isolation.cgroups import memory_capped

    if settings.allow_uncapped_memory or memory_capped():
        return ""
    return ("the service cannot cap a run's memory as a whole here (no writable memory cgroup: run it as root, or "
            "delegate one to its user with NPUPORT_CGROUP_PARENT); it refuses to run ports rather than let one "
            "run hold the host's memory (NPUPORT_ALLOW_UNCAPPED_MEMORY=1 runs them anyway)")


def folder_bytes(folder: Path) -> int:
    """Disk a folder holds (lstat'd: links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def upload_room(store: Any, settings: Settings, owner: str) -> int:
    """Bytes this owner's next upload may unpack to: the service's cap per upload, within what its uploads of
    unfinished jobs already hold of its share. Refuses (413) when nothing is left."""
    held = sum(folder_bytes(Path(j.upload_dir)) for j in store.list_jobs(limit=10_000, owner=owner)
               if j.upload_dir and j.status not in ("validated", "failed", "cancelled") and Path(j.upload_dir).is_dir())
    room = settings.owner_upload_mb * 2**20 - held
    if room <= 0:
        raise JobError(f"this token's uploads hold {held // 2**20} MiB, its share of the disk "
                       f"({settings.owner_upload_mb} MiB); wait for a job to end", 413)
    return min(room, settings.max_extracted_bytes)


def drop_upload(home: Path, upload_dir: str | None) -> None:
    """Remove a finished job's upload (only a folder of the home's uploads, never anything else)."""
    if not upload_dir:
        return
    uploads = (home / "uploads").resolve()
    path = Path(upload_dir)
    if path.resolve().parent == uploads and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
