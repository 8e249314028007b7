"""Subprocess isolation: own process group, wall timeout that kills the whole group, rlimits,
an environment scrubbed of secrets, cwd = the workspace.

`bwrap` (bubblewrap) adds no-network and a read-only system when it is installed and works;
otherwise the plain process sandbox is used and the result says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

# Environment variables that may carry secrets never reach patched code.
_SECRET_PATTERN = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)
# What the sandboxed process may inherit from the host (everything else is dropped).
_KEEP = {
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONHASHSEED",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
    "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH",
    "LD_LIBRARY_PATH", "ASCEND_RT_VISIBLE_DEVICES", "NPUPORT_HOME",
}


@dataclass(frozen=True)
class Limits:
    wall_s: float = 300.0
    cpu_s: int = 0  # 0: wall_s x cores (CPU time adds up over threads; the wall timeout is the real limit)
    address_space_mb: int = 16 * 1024
    max_procs: int = 512
    file_size_mb: int = 1024


@dataclass
class ExecResult:
    returncode: int | None
    status: str  # ok | error | timeout | killed
    wall_s: float
    stdout: str
    stderr: str
    isolation: str
    notes: list[str] = field(default_factory=list)

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

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits) -> ExecResult: ...


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _KEEP and not _SECRET_PATTERN.search(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in (extra or {}).items():
        env[k] = v
    return env


def _preexec(limits: Limits):  # type: ignore[no-untyped-def]
    def apply() -> None:
        os.setsid()  # own process group: the timeout kills everything it started
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_mb * mb, limits.address_space_mb * mb))
        cpu_s = limits.cpu_s or int(limits.wall_s * (os.cpu_count() or 1)) + 10
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb))
        # root in some containers cannot lower NPROC below the current count
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))

    return apply


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class ProcessSandbox:
    """A subprocess in its own session with rlimits and a wall-clock timeout."""

    name = "process"

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits) -> ExecResult:
        return _run(argv, cwd=cwd, env=env, limits=limits, isolation=self.name)


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits, isolation: str) -> ExecResult:
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=str(cwd),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_preexec(limits),  # noqa: PLW1509 - rlimits must be set in the child
    )
    status = "ok"
    try:
        out, err = proc.communicate(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            # A grandchild in a session of its own still holds the pipes: stop reading, keep the verdict.
            proc.kill()
            out, err = b"", b"(output lost: a process outside the run's group kept the pipes open)"
        status = "timeout"
    finally:
        # Children the command left behind die with its group.
        _kill_group(proc)
    rc = proc.returncode
    if status == "ok" and rc != 0:
        status = "killed" if rc is not None and rc < 0 else "error"
    return ExecResult(
        returncode=rc,
        status=status,
        wall_s=time.monotonic() - start,
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        isolation=isolation,
    )


class BubblewrapSandbox:
    """bwrap: no network, read-only root, writable workspace and /tmp only."""

    name = "bwrap"

    def __init__(self, bwrap: str) -> None:
        self.bwrap = bwrap

    def execute(self, argv: list[str], *, cwd: Path, env: dict[str, str], limits: Limits) -> ExecResult:
        wrapped = [
            self.bwrap, "--unshare-net", "--unshare-pid", "--die-with-parent",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", str(cwd), str(cwd), "--chdir", str(cwd), *argv,
        ]
        return _run(wrapped, cwd=cwd, env=env, limits=limits, isolation=self.name)


def _bwrap_works(bwrap: str) -> bool:
    try:
        r = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def default_sandbox() -> Sandbox:
    """bwrap when present and usable (NPUPORT_SANDBOX=process forces the plain one)."""
    from knowledge.settings import settings

    choice = settings().sandbox
    bwrap = shutil.which("bwrap")
    if choice != "process" and bwrap and _bwrap_works(bwrap):
        return BubblewrapSandbox(bwrap)
    return ProcessSandbox()
