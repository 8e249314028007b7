"""Runs left behind: the registry of runs a killed server leaves, reaped when the next one starts (with
the cgroups each run lives in, sandbox/isolation/cgroups.py), and the mark that finds a run's processes
where no cgroup is writable."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from sandbox.isolation.cgroups import RunCgroup, stale_cgroups

# The run's cgroups (pids and memory) live in sandbox/isolation/cgroups.py.
_Cgroup = RunCgroup


# --- orphans: runs left by a server that was killed ----------------------------------------------

def _registry() -> Path:
    from knowledge.home import npuport_home

    return npuport_home() / "sandbox-runs"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): tells a reused pid apart."""
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    return ""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie has exited: /proc says so)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


RUN_MARK_ENV = "SANDBOX_RUN_MARK"
"""A token in each run's environment: without a writable cgroup (a normal user), the processes that left
the run's session are found by it in /proc/*/environ (the initial environment block, which a process
keeps unless it execs itself a new one)."""


def marked_pids(mark: str) -> list[int]:
    needle = f"{RUN_MARK_ENV}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def kill_marked(mark: str) -> int:
    """SIGKILL every process whose environment carries ``mark``, until none is left; how many were killed."""
    killed = 0
    for _ in range(50):
        pids = [p for p in marked_pids(mark) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


def _register(pid: int, cgroup: Path | None, mark: str = "", record: Path | None = None) -> Path | None:
    """Record a run for reap_orphans. Called twice: before the run starts (pid 0: its mark and cgroup
    already find it, so a server killed while starting it leaves nothing behind), then with its pid."""
    try:
        reg = _registry()
        reg.mkdir(parents=True, exist_ok=True)
        rec = record or reg / f"{os.getpid()}-{mark or pid}.json"
        tmp = rec.with_suffix(".tmp")
        tmp.write_text(json.dumps({"server": os.getpid(), "server_start": _start_time(os.getpid()), "pgid": pid,
                                   "start": _start_time(pid) if pid else "", "cgroup": str(cgroup) if cgroup else None,
                                   "mark": mark}))
        os.replace(tmp, rec)  # never a half-written record (reap_orphans drops unreadable ones)
        return rec
    except OSError:
        return record


def reap_orphans() -> int:
    """Kill every sandboxed run whose server is gone (a server killed with SIGKILL cannot clean up):
    the runs it recorded, and any npuport pids cgroup of a dead process. Returns how many were reaped.
    Called when the server starts, before it resumes jobs (which then start fresh runs)."""
    reaped = 0
    reg = _registry()
    for rec in sorted(reg.glob("*.json")) if reg.is_dir() else []:
        try:
            info = json.loads(rec.read_text())
        except (OSError, json.JSONDecodeError):
            rec.unlink(missing_ok=True)
            continue
        server = int(info.get("server") or 0)
        if server and pid_alive(server) and _start_time(server) == info.get("server_start"):
            continue  # its server still runs it
        pgid = int(info.get("pgid") or 0)
        if pgid and _start_time(pgid) == info.get("start"):
            _kill_group(pgid)
            reaped += 1
        if info.get("mark"):
            reaped += bool(kill_marked(str(info["mark"])))
        if info.get("cgroup"):
            cg = RunCgroup.at(Path(info["cgroup"]))
            reaped += bool(cg.pids())
            cg.kill_all()
        rec.unlink(missing_ok=True)
    for cg_dir in stale_cgroups():  # any controller's (pids, memory) cgroup of a dead server
        cg = RunCgroup.at(cg_dir)
        reaped += bool(cg.pids())
        cg.kill_all()
    return reaped


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


