"""The cgroups a run lives in: ``pids`` (a process cap that holds for root, and a way to find every process of
the run) and ``memory`` (one cap on the whole run: every process, and the pages of its private tmpfs, which
the kernel charges to the cgroup of the process that wrote them; swap capped with it).

cgroup v1 (a folder per controller) and v2 (one folder) alike. Where a run's cgroup is made, per controller,
first that is writable: ``NPUPORT_CGROUP_PARENT`` (a folder under the controller's mount that the operator
delegated to the service's user, e.g. ``npuport``), the server's own cgroup (systemd delegation, a container),
the controller's root (root). Without a writable memory cgroup the run's memory is capped per process only
(RLIMIT_AS), and the service refuses to run ports (api/jobs.py) unless its operator allows it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
_seq = itertools.count()


def _mount(controller: str) -> tuple[Path, bool] | None:
    """(the controller's mount, whether it is cgroup v2), or None when it is not mounted."""
    v1 = CGROUP_FS / controller
    if (v1 / "cgroup.procs").exists():
        return v1, False
    with contextlib.suppress(OSError):
        if controller in (CGROUP_FS / "cgroup.controllers").read_text().split():
            return CGROUP_FS, True
    return None


def _own(controller: str, v2: bool) -> str:
    """This process's cgroup for the controller (/proc/self/cgroup), relative to the mount."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if (v2 and names == "") or controller in names.split(","):
                return path.lstrip("/")
    return ""


def parent_dir(controller: str) -> tuple[Path, bool] | None:
    """The folder a run's cgroup of ``controller`` is made in (the first writable candidate), and whether it is
    cgroup v2; None when none is writable."""
    found = _mount(controller)
    if found is None:
        return None
    mount, v2 = found
    from knowledge.settings import settings  # NPUPORT_CGROUP_PARENT

    candidates = [mount / p for p in (settings().cgroup_parent.strip("/"), _own(controller, v2)) if p]
    for folder in [*candidates, mount]:
        if v2 and controller not in _read(folder / "cgroup.subtree_control").split():
            continue
        if folder.is_dir() and os.access(folder, os.W_OK):
            return folder, v2
    return None


def memory_capped() -> bool:
    """Whether a run's memory can be capped as a whole here (a writable memory cgroup)."""
    return parent_dir("memory") is not None


def _read(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


class RunCgroup:
    """The run's cgroups: ``pids.max`` = max_procs, ``memory`` = memory_mb (swap included). ``path`` is the
    folder that lists the run's processes (the pids one, else the memory one)."""

    def __init__(self, max_procs: int, memory_mb: int = 0) -> None:
        self.dirs: dict[str, Path] = {}
        self.memory_mb = memory_mb
        self._v2 = False
        name = f"npuport-{os.getpid()}-{next(_seq)}"
        for controller, settings in (("pids", {"pids.max": str(max_procs)}),
                                     ("memory", self._memory_settings(memory_mb))):
            if controller == "memory" and not memory_mb:
                continue
            made = self._make(controller, name, settings)
            if made is not None:
                self.dirs[controller] = made

    def _memory_settings(self, memory_mb: int) -> dict[str, str]:
        limit = str(memory_mb * 2**20)
        # v1: the cap, then memory+swap at the same figure (no swap beyond it); v2: the cap, no swap
        return {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit,
                "memory.max": limit, "memory.swap.max": "0"}

    def _make(self, controller: str, name: str, settings: dict[str, str]) -> Path | None:
        found = parent_dir(controller)
        if found is None:
            return None
        parent, v2 = found
        path = parent / name
        try:
            path.mkdir(exist_ok=v2)  # v2: one folder holds every controller
            for fname, value in settings.items():
                if (path / fname).exists():
                    (path / fname).write_text(value)
            self._v2 = v2
            return path
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return None

    @property
    def path(self) -> Path | None:
        return self.dirs.get("pids") or self.dirs.get("memory")

    @property
    def memory(self) -> Path | None:
        return self.dirs.get("memory")

    def procs_files(self) -> list[Path]:
        """The cgroup.procs files a run's first process writes itself into (before exec: every descendant follows)."""
        return [p / "cgroup.procs" for p in dict.fromkeys(self.dirs.values())]

    def pids(self) -> list[int]:
        if self.path is None:
            return []
        with contextlib.suppress(OSError, ValueError):
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        return []

    def memory_note(self) -> str:
        """What the run's memory cap did: "" when it was never reached."""
        mem = self.memory
        if mem is None:
            return ""
        events = _read(mem / "memory.events") + _read(mem / "memory.oom_control")  # v2, v1
        oom = sum(int(line.split()[1]) for line in events.splitlines() if line.startswith("oom_kill "))
        failed = int(_read(mem / "memory.failcnt").strip() or 0) + int(_read(mem / "memory.memsw.failcnt").strip() or 0)
        if oom or failed:
            return (f"the run reached its memory cap ({self.memory_mb} MiB for all its processes and its /tmp); "
                    "the kernel refused or killed what went beyond it")
        return ""

    def missing(self) -> list[str]:
        """What the run goes without (notes for its result)."""
        notes = []
        if self.path is None and os.geteuid() == 0:
            notes.append("process limit not enforced: running as root and no writable pids cgroup")
        if self.memory is None and self.memory_mb:
            notes.append("memory capped per process only: no writable memory cgroup for the run as a whole")
        return notes

    def end(self) -> list[str]:
        """Kill what is left of the run and remove its cgroups; a note when its memory cap was reached."""
        note = self.memory_note()
        self.kill_all()
        return [note] if note else []

    def kill_all(self) -> None:
        """SIGKILL every process in the group until none is left (pids.max bounds how many can appear), then
        remove the cgroups."""
        if self.path is not None:
            for _ in range(200):
                pids = self.pids()
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.01)
        for folder in dict.fromkeys(self.dirs.values()):
            for _ in range(50):  # a cgroup whose last process is still exiting is busy for a moment
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)

    @classmethod
    def at(cls, path: Path) -> RunCgroup:
        """The cgroup of a run recorded by a server that died (its pids folder)."""
        cg = cls.__new__(cls)
        cg.dirs = {"pids": path} if path.is_dir() else {}
        cg.memory_mb = 0
        cg._v2 = False
        return cg


def stale_cgroups() -> list[Path]:
    """npuport's run cgroups (every controller) whose server process is gone."""
    out: list[Path] = []
    for controller in ("pids", "memory"):
        found = parent_dir(controller)
        for folder in found[0].glob("npuport-*") if found else []:
            owner = folder.name.split("-")[1]
            if owner.isdigit() and not _alive(int(owner)):
                out.append(folder)
    return list(dict.fromkeys(out))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
