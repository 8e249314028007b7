"""Subprocess isolation for code npuport did not write.

Two sandboxes share one runner (``_run``):

- ``BubblewrapSandbox`` (the default where bwrap works; its command line is sandbox/isolation/bwrap.py): an
  allow-listed read-only view of the system, sized tmpfs on /tmp and over every home directory and
  NPUPORT_HOME, the interpreter and its environment bound back read-only wherever they live, only the
  paths the caller names writable; no privilege (uid 65534 in a user namespace, no capabilities, a
  seccomp filter: sandbox/isolation/confine.py); new PID, IPC, UTS and network namespaces, ``--die-with-parent``
  and ``--new-session``. When the run ends, the PID namespace takes every process it started with it.
- ``ProcessSandbox``: a session of its own, rlimits, a scrubbed environment. It is NOT a security
  boundary (the code can read and write whatever the server's user can), so it runs untrusted code only
  when asked for explicitly (``NPUPORT_ISOLATION=process`` / ``--isolation process``) and every result
  says ``isolation: process``.

Both put the run in cgroups (sandbox/isolation/cgroups.py) when the host lets us: ``pids.max`` (the only process
cap that holds for root, which ignores RLIMIT_NPROC; without one, processes that left the session are found by a
mark in their environment: sandbox/isolation/reaper.py) and ``memory`` (the whole run, its tmpfs pages and swap
included); read stdout/stderr incrementally with a size cap, enforce the wall time on the whole tree and the run
folder's quota, and stop when the job that started the run is cancelled (``stop_runs_when``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from knowledge.errors import IsolationUnavailable
from knowledge.interrupt import PortInterrupted, raise_if_stopped, stop_requested
from sandbox.isolation.bwrap import _interpreter_paths as _interpreter_paths
from sandbox.isolation.bwrap import bwrap_command
from sandbox.isolation.cgroups import RunCgroup
from sandbox.isolation.confine import seccomp_fd
from sandbox.isolation.reaper import (
    RUN_MARK_ENV,
    _kill_group,
    _register,
    kill_marked,
)
from sandbox.isolation.rundir import over_quota

# Environment variables that may carry secrets never reach patched code.
_SECRET_PATTERN = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)
# What the sandboxed process may inherit from the host (everything else is dropped).
_KEEP = {
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONHASHSEED",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
    "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH",
    "LD_LIBRARY_PATH", "ASCEND_RT_VISIBLE_DEVICES", "NPUPORT_HOME",
    "NPUPORT_MOE_DENSE_MAX_RATIO",  # read by moe-dense-dispatch's patched code when it runs
}
MAX_OUTPUT_BYTES = 1024 * 1024  # per stream; the rest is dropped and the result says so
DRAIN_AFTER_EXIT_S = 1.0  # how long pipes are read after the command exits (a grandchild may hold them)


@dataclass(frozen=True)
class Limits:
    wall_s: float = 300.0
    cpu_s: int = 0  # 0: wall_s x cores (CPU time adds up over threads; the wall timeout is the real limit)
    address_space_mb: int = 16 * 1024
    max_procs: int = 512
    file_size_mb: int = 1024
    max_output_bytes: int = MAX_OUTPUT_BYTES
    tmpfs_mb: int = 2048  # size of the run's /tmp (bwrap); its pages are charged to the run's memory cgroup
    folder_quota_mb: int = 4096  # the run folder (cwd) as a whole; 0: unchecked. RLIMIT_FSIZE caps one file
    memory_mb: int = 16 * 1024  # the whole run (every process, its /tmp, swap): the memory cgroup's cap; 0: none
    workspace_quota_mb: int = 8192  # the port's workspace (every run folder, the model's copies): no run starts beyond


@dataclass(frozen=True)
class Mounts:
    """What a bwrap run sees of the host beyond the system and the interpreter: ``hide`` is masked by
    an empty tmpfs, then ``ro`` is bound read-only and ``rw`` read-write (in that order, so a writable
    run folder can sit inside a hidden workspace). ``interpreters`` are bound back with their envs, like
    the one the command starts with."""

    hide: tuple[Path, ...] = ()
    ro: tuple[Path, ...] = ()
    rw: tuple[Path, ...] = ()
    interpreters: tuple[str, ...] = ()  # further interpreters the run starts (a layered env's, for the worker)


@dataclass
class ExecResult:
    returncode: int | None
    status: str  # ok | error | timeout | killed
    wall_s: float
    stdout: str
    stderr: str
    isolation: str
    notes: list[str] = field(default_factory=list)
    channel: bytes = b""  # what the run wrote on the result channel (result_channel=True)
    channel_overflow: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "returncode": self.returncode,
            "status": self.status,
            "wall_s": self.wall_s,
            "isolation": self.isolation,
            "notes": self.notes,
        }


class Sandbox(Protocol):
    """Runs a command in isolation and returns what happened."""

    name: str

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits,
                mounts: Mounts | None = None, result_channel: bool = False,
                channel_cap: int = 0) -> ExecResult: ...


_registered_secrets: set[str] = set()
MIN_SECRET_LEN = 6


def register_secret(value: str) -> None:
    """A value (an API token, an LLM key) that must never appear in text leaving a sandbox run."""
    if value and len(value) >= MIN_SECRET_LEN:
        _registered_secrets.add(value)


def _secrets() -> list[str]:
    found = {v for k, v in os.environ.items() if _SECRET_PATTERN.search(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(found | _registered_secrets, key=len, reverse=True)


def scrub(text: str) -> str:
    """Replace every known secret (secret-looking environment variables, registered tokens) by ***."""
    for secret in _secrets():
        if secret in text:
            text = text.replace(secret, "***")
    return text


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _KEEP and not _SECRET_PATTERN.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in (extra or {}).items():
        env[k] = v
    return env


RESULT_FD_ENV = "HARNESS_RESULT_FD"
"""Tells the harness the fd number of its result channel (a pipe the parent opened for this run)."""


# --- cancel: a job's cancel (or the service's shutdown) kills the run in flight, not after it -------

_stop_check: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("npuport_stop_runs",
                                                                                        default=None)
CANCEL_POLL_S = 0.1


@contextlib.contextmanager
def stop_runs_when(check: Callable[[], bool]) -> Iterator[None]:
    """Every sandbox run started in this context (LangGraph copies it into node threads) is killed as
    soon as ``check()`` turns true; its result says it was cancelled."""
    token = _stop_check.set(check)
    try:
        yield
    finally:
        _stop_check.reset(token)


def uid_tasks(uid: int | None = None) -> int:
    """Tasks (threads) the user runs now, as RLIMIT_NPROC counts them."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields.get("Threads", "1"))
    return count


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): a server killed with SIGKILL takes its runs down with it."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _preexec(limits: Limits, cgroups: list[Path]):  # type: ignore[no-untyped-def]
    # RLIMIT_NPROC counts every task of the user, not the run's: the run gets max_procs beyond what the
    # user already runs (a server or a test runner with its own threads would otherwise leave it none).
    nproc = uid_tasks() + limits.max_procs  # counted here, in the parent, not between fork and exec

    def apply() -> None:
        _die_with_parent()
        for procs in cgroups:
            # join before exec, so every descendant is counted, capped and found
            with open(procs, "w") as fh:
                fh.write("0")
        os.setsid()  # own process group: the timeout kills everything it started
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_mb * mb, limits.address_space_mb * mb))
        cpu_s = limits.cpu_s or int(limits.wall_s * (os.cpu_count() or 1)) + 10
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb))
        # Root in some containers cannot lower NPROC below the current count (and root with CAP_SYS_RESOURCE
        # ignores it; the cgroup's pids.max is the cap that holds there).
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


QUOTA_CHECK_S = 1.0


class ProcessSandbox:
    """A subprocess in its own session with rlimits and a wall-clock timeout. Not isolated."""

    name = "process"

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits,
                mounts: Mounts | None = None, result_channel: bool = False,
                channel_cap: int = 0) -> ExecResult:
        res = _run(argv, cwd=cwd, env=env, limits=limits, isolation=self.name, result_channel=result_channel,
                   channel_cap=channel_cap)
        res.notes.insert(0, "unisolated: the run could read and write whatever the server's user can")
        return res


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits, isolation: str,
         result_channel: bool = False, channel_cap: int = 0, extra_fds: tuple[int, ...] = ()) -> ExecResult:
    """Run ``argv``; read stdout/stderr (and the result channel, an fd number the child inherits) with caps."""
    raise_if_stopped("starting a sandbox")  # Ctrl-C: no new work starts (knowledge/interrupt.py)
    start = time.monotonic()
    cgroup = RunCgroup(limits.max_procs, limits.memory_mb)
    notes: list[str] = cgroup.missing()
    mark = secrets.token_hex(8)
    proc, chan_r, record = _start(argv, cwd, {**env, RUN_MARK_ENV: mark}, limits, cgroup, mark, result_channel,
                                  extra_fds)
    assert proc.stdout is not None and proc.stderr is not None
    caps = {proc.stdout.fileno(): limits.max_output_bytes, proc.stderr.fileno(): limits.max_output_bytes}
    if chan_r is not None:
        caps[chan_r] = channel_cap
    streams = _Streams.of(caps)
    try:
        status = _watch(proc, streams, limits, cwd, start, notes)
    finally:
        streams.sel.close()
        # Children the command left behind die with it: group, session-leaving daemons (cgroup).
        _kill_group(proc.pid)
        notes += cgroup.end()  # every process killed, the cgroups removed; whether the memory cap was reached
        if cgroup.path is None:  # no cgroup (a normal user): what left the session is found by its mark
            kill_marked(mark)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        proc.stdout.close()
        proc.stderr.close()
        if chan_r is not None:
            os.close(chan_r)
        if record is not None:
            record.unlink(missing_ok=True)
    if status == "interrupted":
        raise PortInterrupted(f"a sandbox run was interrupted after {time.monotonic() - start:.1f}s")
    return _result(proc, status, streams, chan_r, time.monotonic() - start, isolation, notes)


def _start(argv: list[str], cwd: Path, env: dict[str, str], limits: Limits, cgroup: RunCgroup, mark: str,
           result_channel: bool, extra_fds: tuple[int, ...]) -> tuple[subprocess.Popen[bytes], int | None, Path | None]:
    """The run's process, the read end of its result channel (or None) and its record for the reaper."""
    chan_r: int | None = None
    chan_w: int | None = None
    pass_fds: tuple[int, ...] = extra_fds  # bwrap's seccomp program
    if result_channel:
        # The write end keeps whatever number the OS gave it: a fixed number dup2'd here would clobber an
        # fd the parent (a threaded server, other runs) already holds. The child learns it from the env.
        chan_r, chan_w = os.pipe()
        pass_fds = (*extra_fds, chan_w)
        env = {**env, RESULT_FD_ENV: str(chan_w)}
    record = _register(0, cgroup.path, mark)  # before the start: a server killed now leaves no run unrecorded
    try:
        proc = subprocess.Popen(
            argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            preexec_fn=_preexec(limits, cgroup.procs_files()),  # noqa: PLW1509 - rlimits must be set in the child
        )
    except BaseException:
        if chan_r is not None:
            os.close(chan_r)
        if record is not None:
            record.unlink(missing_ok=True)
        raise
    finally:
        if chan_w is not None:
            os.close(chan_w)  # only the child holds the write end: EOF means it is gone
    return proc, chan_r, _register(proc.pid, cgroup.path, mark, record)


@dataclass
class _Streams:
    """The run's pipes, read without blocking; each keeps up to its cap and counts what it dropped."""

    sel: selectors.BaseSelector
    bufs: dict[int, bytearray]
    caps: dict[int, int]
    dropped: dict[int, int]

    @classmethod
    def of(cls, caps: dict[int, int]) -> _Streams:
        sel = selectors.DefaultSelector()
        for fd in caps:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        return cls(sel, {fd: bytearray() for fd in caps}, dict(caps), dict.fromkeys(caps, 0))

    def open(self) -> bool:
        return bool(self.sel.get_map())

    def read(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=timeout):
            fd = int(key.fd)
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(fd)
                continue
            room = max(self.caps[fd] - len(self.bufs[fd]), 0)
            self.bufs[fd] += chunk[:room]
            self.dropped[fd] += max(len(chunk) - room, 0)


def _stopped(stop: Callable[[], bool] | None, notes: list[str]) -> str | None:
    """``killed`` when the job that started the run was cancelled, ``interrupted`` on Ctrl-C (the caller's
    cleanup kills the run's group and cgroup), else None."""
    if stop is not None and stop():
        notes.append("cancelled: the run was killed while it ran")
        return "killed"
    return "interrupted" if stop_requested() else None


def _watch(proc: subprocess.Popen[bytes], streams: _Streams, limits: Limits, cwd: Path, start: float,
           notes: list[str]) -> str:
    """Read the run's output until its pipes close, then wait for it; the run's status (ok, timeout, killed,
    interrupted) by the wall time, the cancel, Ctrl-C and the run folder's quota."""
    deadline = start + limits.wall_s
    stop = _stop_check.get()
    quota = limits.folder_quota_mb * 1024 * 1024
    next_quota_check = start + QUOTA_CHECK_S
    exited_at: float | None = None
    while streams.open():
        now = time.monotonic()
        if ended := _stopped(stop, notes):
            return ended
        if quota and now >= next_quota_check:
            next_quota_check = now + QUOTA_CHECK_S
            if over := over_quota(cwd, quota):
                notes.append(f"run folder over its quota ({over}); the run was killed")
                return "killed"
        if proc.poll() is not None and exited_at is None:
            exited_at = now
        if exited_at is not None and now - exited_at > DRAIN_AFTER_EXIT_S:
            notes.append("a process left behind kept the output pipes open; it was killed")
            return "ok"
        if exited_at is None and now > deadline:
            return "timeout"
        streams.read(0.1)
    while proc.poll() is None:
        # every pipe closed but the command runs on: wait for it within the wall time (and the cancel)
        if ended := _stopped(stop, notes):
            return ended
        if time.monotonic() > deadline:
            return "timeout"
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=min(CANCEL_POLL_S, max(deadline - time.monotonic(), 0.01)))
    return "ok"


def _result(proc: subprocess.Popen[bytes], status: str, streams: _Streams, chan_r: int | None, wall_s: float,
            isolation: str, notes: list[str]) -> ExecResult:
    rc = proc.returncode
    if status == "ok" and rc != 0:
        status = "killed" if rc is not None and rc < 0 else "error"
    out, err = list(streams.bufs)[:2]
    for fd, label in ((out, "stdout"), (err, "stderr")):
        if streams.dropped[fd]:
            notes.append(f"{label} truncated: kept the first {streams.caps[fd]} bytes, dropped {streams.dropped[fd]}")
    return ExecResult(
        returncode=rc, status=status, wall_s=wall_s,
        stdout=streams.bufs[out].decode("utf-8", "replace"), stderr=streams.bufs[err].decode("utf-8", "replace"),
        isolation=isolation, notes=notes, channel=bytes(streams.bufs[chan_r]) if chan_r is not None else b"",
        channel_overflow=bool(chan_r is not None and streams.dropped[chan_r]),
    )


class BubblewrapSandbox:
    """bwrap: an allow-listed read-only view of the host, no network, no privilege (uid 65534 in a user
    namespace, no capabilities, a seccomp filter), only ``mounts.rw`` writable (sandbox/isolation/bwrap.py)."""

    name = "bwrap"

    def __init__(self, bwrap: str) -> None:
        self.bwrap = bwrap

    def command(self, argv: list[str], *, cwd: Path, mounts: Mounts, limits: Limits | None = None,
                filter_fd: int | None = None) -> list[str]:
        return bwrap_command(self.bwrap, argv, cwd=cwd, mounts=mounts, limits=limits or Limits(), filter_fd=filter_fd)

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits,
                mounts: Mounts | None = None, result_channel: bool = False,
                channel_cap: int = 0) -> ExecResult:
        fd = seccomp_fd()
        try:
            wrapped = self.command(argv, cwd=cwd, mounts=mounts or Mounts(rw=(cwd,)), limits=limits, filter_fd=fd)
            return _run(wrapped, cwd=cwd, env=env, limits=limits, isolation=self.name,
                        result_channel=result_channel, channel_cap=channel_cap,
                        extra_fds=() if fd is None else (fd,))
        finally:
            if fd is not None:
                os.close(fd)


def _bwrap_works(bwrap: str) -> bool:
    try:
        r = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "true"],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def bwrap_available() -> str | None:
    bwrap = shutil.which("bwrap")
    return bwrap if bwrap and _bwrap_works(bwrap) else None




def default_sandbox(*, allow_process: bool | None = None) -> Sandbox:
    """bwrap when present and usable. ``process`` runs only when chosen explicitly (the setting) or
    when the caller allows the fallback (the CLI porting the user's own model, with a visible
    warning); ``bwrap`` insists. Otherwise IsolationUnavailable."""
    from knowledge.settings import (
        settings,  # here: a sandboxed worker may import this module without pydantic
    )

    conf = settings()  # NPUPORT_ISOLATION (its older name NPUPORT_SANDBOX): auto | bwrap | process
    choice = conf.isolation_choice
    if choice == "process":
        return ProcessSandbox()
    bwrap = bwrap_available()
    if bwrap:
        return BubblewrapSandbox(bwrap)
    if choice != "bwrap" and (allow_process if allow_process is not None else conf.allow_unisolated):
        return ProcessSandbox()
    raise IsolationUnavailable("bubblewrap (bwrap) is not installed or cannot create namespaces here, so untrusted "
                               "model code cannot be isolated; install bubblewrap, or run unisolated explicitly "
                               "with --isolation process (NPUPORT_ISOLATION=process)")


