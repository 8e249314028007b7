"""Subprocess isolation for code npuport did not write.

Two sandboxes share one runner (``_run``):

- ``BubblewrapSandbox`` (the default where bwrap works): a read-only view of the system, a fresh tmpfs
  on /tmp and over every home directory, the interpreter and its environment bound back read-only
  wherever they live (a venv under /tmp or $HOME works), only the paths the caller names writable;
  new PID, IPC, UTS and network namespaces, ``--die-with-parent`` and ``--new-session``. When the run
  ends, the PID namespace takes every process it started with it (setsid daemons included).
- ``ProcessSandbox``: a session of its own, rlimits, a scrubbed environment. It is NOT a security
  boundary (the code can read and write whatever the server's user can), so it runs untrusted code only
  when asked for explicitly (``NPUPORT_ISOLATION=process`` / ``--isolation process``) and every result
  says ``isolation: process``.

Both put the run in a cgroup with a ``pids.max`` when the host lets us (the only process cap that holds
for root, which ignores RLIMIT_NPROC), read stdout/stderr incrementally with a size cap, and enforce the
wall time on the whole tree.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from knowledge.interrupt import PortInterrupted, raise_if_stopped, stop_requested

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


@dataclass(frozen=True)
class Mounts:
    """What a bwrap run sees of the host beyond the system and the interpreter: ``hide`` is masked by
    an empty tmpfs, then ``ro`` is bound read-only and ``rw`` read-write (in that order, so a writable
    run folder can sit inside a hidden workspace)."""

    hide: tuple[Path, ...] = ()
    ro: tuple[Path, ...] = ()
    rw: tuple[Path, ...] = ()


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


# --- cgroup: a process cap that holds for root, and a way to find every process of the run ----------

_cgroup_seq = itertools.count()


def _pids_cgroup_root() -> Path | None:
    """A writable folder of the pids controller (cgroup v1 or v2), or None."""
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists() and os.access(v1, os.W_OK):
        return v1
    v2 = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        if "pids" in (v2 / "cgroup.subtree_control").read_text().split() and os.access(v2, os.W_OK):
            return v2
    return None


class _Cgroup:
    def __init__(self, max_procs: int) -> None:
        self.path: Path | None = None
        root = _pids_cgroup_root()
        if root is None:
            return
        path = root / f"npuport-{os.getpid()}-{next(_cgroup_seq)}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(str(max_procs))
            self.path = path
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()

    def pids(self) -> list[int]:
        if self.path is None:
            return []
        with contextlib.suppress(OSError):
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        return []

    def kill_all(self) -> None:
        """SIGKILL every process in the group until none is left (pids.max bounds how many can appear)."""
        if self.path is None:
            return
        for _ in range(200):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG(SIGKILL): a server killed with SIGKILL takes its runs down with it."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _preexec(limits: Limits, cgroup: Path | None):  # type: ignore[no-untyped-def]
    def apply() -> None:
        _die_with_parent()
        if cgroup is not None:
            # join before exec, so every descendant is counted and found
            with open(cgroup / "cgroup.procs", "w") as fh:
                fh.write("0")
        os.setsid()  # own process group: the timeout kills everything it started
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_mb * mb, limits.address_space_mb * mb))
        cpu_s = limits.cpu_s or int(limits.wall_s * (os.cpu_count() or 1)) + 10
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb))
        # root in some containers cannot lower NPROC below the current count (and root ignores it anyway)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))

    return apply


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


def _register(pid: int, cgroup: Path | None) -> Path | None:
    try:
        reg = _registry()
        reg.mkdir(parents=True, exist_ok=True)
        rec = reg / f"{os.getpid()}-{pid}.json"
        rec.write_text(json.dumps({"server": os.getpid(), "server_start": _start_time(os.getpid()), "pgid": pid,
                                   "start": _start_time(pid), "cgroup": str(cgroup) if cgroup else None}))
        return rec
    except OSError:
        return None


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
        if info.get("cgroup"):
            cg = _Cgroup.__new__(_Cgroup)
            cg.path = Path(info["cgroup"]) if Path(info["cgroup"]).is_dir() else None
            reaped += bool(cg.pids())
            cg.kill_all()
        rec.unlink(missing_ok=True)
    root = _pids_cgroup_root()
    for cg_dir in root.glob("npuport-*") if root else []:
        owner = cg_dir.name.split("-")[1]
        if owner.isdigit() and not pid_alive(int(owner)):
            cg = _Cgroup.__new__(_Cgroup)
            cg.path = cg_dir
            reaped += bool(cg.pids())
            cg.kill_all()
    return reaped


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


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
         result_channel: bool = False, channel_cap: int = 0) -> ExecResult:
    """Run ``argv``; read stdout/stderr (and the result channel, an fd number the child inherits) with caps."""
    raise_if_stopped("starting a sandbox")  # Ctrl-C: no new work starts (knowledge/interrupt.py)
    start = time.monotonic()
    cgroup = _Cgroup(limits.max_procs)
    notes: list[str] = []
    if cgroup.path is None and os.geteuid() == 0:
        notes.append("process limit not enforced: running as root and no writable pids cgroup")
    chan_r: int | None = None
    chan_w: int | None = None
    pass_fds: tuple[int, ...] = ()
    if result_channel:
        # The write end keeps whatever number the OS gave it: a fixed number dup2'd here would clobber an
        # fd the parent (a threaded server, other runs) already holds. The child learns it from the env.
        chan_r, chan_w = os.pipe()
        pass_fds = (chan_w,)
        env = {**env, RESULT_FD_ENV: str(chan_w)}
    try:
        proc = subprocess.Popen(
            argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            preexec_fn=_preexec(limits, cgroup.path),  # noqa: PLW1509 - rlimits must be set in the child
        )
    except BaseException:
        if chan_r is not None:
            os.close(chan_r)
        raise
    finally:
        if chan_w is not None:
            os.close(chan_w)  # only the child holds the write end: EOF means it is gone
    record = _register(proc.pid, cgroup.path)
    assert proc.stdout is not None and proc.stderr is not None
    bufs: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    caps = {fd: limits.max_output_bytes for fd in bufs}
    dropped = dict.fromkeys(bufs, 0)
    if chan_r is not None:
        bufs[chan_r] = bytearray()
        caps[chan_r] = channel_cap
        dropped[chan_r] = 0
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = start + limits.wall_s
    status = "ok"
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if proc.poll() is not None and exited_at is None:
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_AFTER_EXIT_S:
                notes.append("a process left behind kept the output pipes open; it was killed")
                break
            if exited_at is None and now > deadline:
                status = "timeout"
                break
            if stop_requested():  # Ctrl-C: the finally below kills the run's group and cgroup
                status = "interrupted"
                break
            for key, _ in sel.select(timeout=0.1):
                fd = int(key.fd)
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                room = caps[fd] - len(bufs[fd])
                bufs[fd] += chunk[:max(room, 0)]
                dropped[fd] += max(len(chunk) - max(room, 0), 0)
        if proc.poll() is None and status != "interrupted":
            # every pipe closed but the command runs on: wait for it within the wall time
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                status = "timeout"
    finally:
        sel.close()
        # Children the command left behind die with it: group, session-leaving daemons (cgroup).
        _kill_group(proc.pid)
        cgroup.kill_all()
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
    rc = proc.returncode
    if status == "ok" and rc != 0:
        status = "killed" if rc is not None and rc < 0 else "error"
    streams = list(bufs)
    for fd, label in zip(streams[:2], ("stdout", "stderr"), strict=True):
        if dropped[fd]:
            notes.append(f"{label} truncated: kept the first {caps[fd]} bytes, dropped {dropped[fd]}")
    channel = bytes(bufs[chan_r]) if chan_r is not None else b""
    overflow = bool(chan_r is not None and dropped[chan_r])
    return ExecResult(
        returncode=rc, status=status, wall_s=time.monotonic() - start,
        stdout=bufs[streams[0]].decode("utf-8", "replace"), stderr=bufs[streams[1]].decode("utf-8", "replace"),
        isolation=isolation, notes=notes, channel=channel, channel_overflow=overflow,
    )


def _interpreter_paths(python: str) -> set[Path]:
    """Folders an interpreter needs: its prefix, a venv's base interpreter, our own sys.path."""
    paths: set[Path] = set()
    exe = Path(python)
    for p in (exe, exe.resolve()):
        paths.add(p.parent.parent)
        cfg = p.parent.parent / "pyvenv.cfg"
        if cfg.is_file():
            for line in cfg.read_text(errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    paths.add(Path(value.strip()).parent)
        # A layered env (agents/env_resolve.py) names the folders it reads besides its own: a torch pair's
        # base env. Under a masked home they are invisible unless bound too.
        marker = p.parent.parent / "npuport-env.json"
        if marker.is_file():
            try:
                layers = json.loads(marker.read_text()).get("layers") or []
            except (OSError, ValueError, AttributeError):
                layers = []
            for layer in layers:
                paths |= _interpreter_paths(str(Path(layer) / "bin" / "python")) if Path(layer).is_dir() else set()
    return paths


def _host_paths(argv: list[str]) -> list[Path]:
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    paths |= _interpreter_paths(sys.executable)
    if argv and ("python" in Path(argv[0]).name):
        paths |= _interpreter_paths(argv[0])
    # sys.path's package folders only: its first entry may be the server's cwd (a home directory)
    paths |= {Path(p) for p in sys.path if p and Path(p).is_dir()
              and ("site-packages" in p or "dist-packages" in p or Path(p).name.startswith("python"))}
    paths.add(Path(__file__).resolve().parent.parent)  # the npuport package itself (editable installs)
    # NPUPORT_HOME is not bound: it holds other jobs' workspaces, uploads and the job database. What a run
    # needs from it (the op matrix, the native engine, a layered env) is bound by path.
    paths.add(Path.home() / ".cache" / "npuport")  # the shared native engine cache
    from knowledge.settings import settings

    conf = settings()
    paths |= {p for p in (conf.native_cache, conf.env_cache) if p is not None}
    return sorted({p.resolve() for p in paths if p.exists()} | {p for p in paths if p.exists()})


def _homes() -> list[Path]:
    homes = {Path.home(), Path("/root"), Path("/home")}
    return sorted(h for h in homes if h.is_dir() and h != Path("/"))


class BubblewrapSandbox:
    """bwrap: no network, read-only system, the homes and /tmp masked, only ``mounts.rw`` writable."""

    name = "bwrap"

    def __init__(self, bwrap: str) -> None:
        self.bwrap = bwrap

    def command(self, argv: list[str], *, cwd: Path, mounts: Mounts) -> list[str]:
        args = [self.bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for masked in (*_homes(), Path("/run"), Path("/var/run")):
            if masked.is_dir() and not masked.is_symlink():
                args += ["--tmpfs", str(masked)]
        for p in _host_paths(argv):
            args += ["--ro-bind", str(p), str(p)]
        for p in mounts.hide:
            args += ["--tmpfs", str(p)]
        for p in mounts.ro:
            args += ["--ro-bind", str(p), str(p)]
        for p in mounts.rw:
            args += ["--bind", str(p), str(p)]
        return [*args, "--chdir", str(cwd), *argv]

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits,
                mounts: Mounts | None = None, result_channel: bool = False,
                channel_cap: int = 0) -> ExecResult:
        wrapped = self.command(argv, cwd=cwd, mounts=mounts or Mounts(rw=(cwd,)))
        return _run(wrapped, cwd=cwd, env=env, limits=limits, isolation=self.name, result_channel=result_channel,
                    channel_cap=channel_cap)


def _bwrap_works(bwrap: str) -> bool:
    try:
        r = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "true"],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


class IsolationUnavailable(RuntimeError):
    """bwrap is missing or unusable and nobody allowed unisolated runs."""


def isolation_setting() -> str:
    """``NPUPORT_ISOLATION`` (``NPUPORT_SANDBOX`` is its older name): auto | bwrap | process."""
    from knowledge.settings import settings

    conf = settings()
    chosen = conf.isolation if "NPUPORT_ISOLATION" in os.environ else (conf.sandbox or conf.isolation)
    return (chosen or "auto").strip().lower()


def bwrap_available() -> str | None:
    bwrap = shutil.which("bwrap")
    return bwrap if bwrap and _bwrap_works(bwrap) else None


def _allow_unisolated() -> bool:
    from knowledge.settings import settings

    return settings().allow_unisolated


def default_sandbox(*, allow_process: bool | None = None) -> Sandbox:
    """bwrap when present and usable. ``process`` runs only when chosen explicitly (the setting) or
    when the caller allows the fallback (the CLI porting the user's own model, with a visible
    warning); ``bwrap`` insists. Otherwise IsolationUnavailable."""
    choice = isolation_setting()
    if choice == "process":
        return ProcessSandbox()
    bwrap = bwrap_available()
    if bwrap:
        return BubblewrapSandbox(bwrap)
    if choice != "bwrap" and (allow_process if allow_process is not None
                              else _allow_unisolated()):
        return ProcessSandbox()
    raise IsolationUnavailable("bubblewrap (bwrap) is not installed or cannot create namespaces here, so untrusted "
                               "model code cannot be isolated; install bubblewrap, or run unisolated explicitly "
                               "with --isolation process (NPUPORT_ISOLATION=process)")
