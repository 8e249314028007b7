"""The run folder is hostile data: the model's code could write anything there (links, FIFOs, device-
less special files, a zip that inflates to gigabytes). The parent, which runs outside the sandbox,
touches it only through these functions:

- ``write_own``: the parent's own files (spec, logs, result). Whatever the run left under that name
  is removed first (a link is unlinked, never followed) and the file is created with
  ``O_EXCL|O_NOFOLLOW``: npuport never writes through a name the model chose.
- ``read_bounded``: ``lstat`` first, then ``O_NOFOLLOW|O_NONBLOCK`` (a FIFO cannot block the parent),
  a regular file only (the same inode lstat saw), at most ``max_bytes``.
- ``check_zip_bounded``: a torch capture file is a zip; its members' inflated sizes are summed before
  anything loads it.

Every run has ended (its PID namespace and cgroup killed) before the parent calls these, so nothing
can swap a name between the check and the open.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import zipfile
from pathlib import Path

from knowledge.errors import NpuportError


class HostileRunFile(NpuportError):
    """A file the run left is not what the parent expects (a link, a FIFO, too large)."""


def discard(path: Path) -> None:
    """Remove whatever is at ``path`` (a file, link, FIFO or folder) without following it."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # rmtree never follows links inside
    else:
        path.unlink()


def write_own(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Create ``path`` afresh with ``data`` (the folder is the parent's; the name may be the run's)."""
    discard(path)
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)


def open_regular(path: Path, max_bytes: int) -> int:
    """An fd on ``path`` if it is a regular file (not a link, FIFO or device) of at most ``max_bytes``."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode):
        raise HostileRunFile(f"{path.name} is not a regular file (a link, FIFO or folder left by the run)")
    if st.st_size > max_bytes:
        raise HostileRunFile(f"{path.name} is {st.st_size} bytes; the cap is {max_bytes}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    fst = os.fstat(fd)
    if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise HostileRunFile(f"{path.name} changed between lstat and open")
    return fd


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file the run wrote, refusing links, FIFOs and anything over ``max_bytes``."""
    fd = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise HostileRunFile(f"{path.name} grew past {max_bytes} bytes")
    return data


def check_zip_bounded(path: Path, max_bytes: int, max_inflated: int, max_members: int = 100_000) -> None:
    """Refuse a zip (a torch.save file) that is not a regular file, is too large, or would inflate past
    ``max_inflated`` bytes: the sizes in its central directory are what the loader allocates."""
    fd = open_regular(path, max_bytes)
    with os.fdopen(fd, "rb") as fh:
        try:
            with zipfile.ZipFile(fh) as zf:
                infos = zf.infolist()
        except zipfile.BadZipFile as exc:
            raise HostileRunFile(f"{path.name} is not a zip archive: {exc}") from exc
    if len(infos) > max_members:
        raise HostileRunFile(f"{path.name} has {len(infos)} members; the cap is {max_members}")
    total = sum(max(i.file_size, 0) for i in infos)
    if total > max_inflated:
        raise HostileRunFile(f"{path.name} inflates to {total} bytes; the cap is {max_inflated}")


MAX_FOLDER_ENTRIES = 100_000


def over_quota(folder: Path, quota: int) -> str:
    """Why ``folder`` is over ``quota`` bytes of disk (or holds too many entries to count), or "". Links are
    not followed; a sparse file counts what it holds on disk."""
    used, entries, stack = 0, 0, [folder]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for e in it:
                entries += 1
                if entries > MAX_FOLDER_ENTRIES:
                    return f"more than {MAX_FOLDER_ENTRIES} files and folders"
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    used += st.st_blocks * 512  # disk actually used: a sparse file is not a full one
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
        if used > quota:
            return f"{used // 2**20} MiB used, the quota is {quota // 2**20} MiB"
    return ""


def workspace_problem(workdir: Path, quota_mb: int) -> str:
    """Why no further run of this port may start: its workspace (every run folder, the model's copies) holds more
    than ``quota_mb`` (each run folder is capped while it runs, ``Limits.folder_quota_mb``; this caps their sum)."""
    if not quota_mb or not Path(workdir).is_dir():
        return ""
    over = over_quota(Path(workdir), quota_mb * 2**20)
    return f"the port's workspace is over its disk quota ({over}); no further run starts" if over else ""

