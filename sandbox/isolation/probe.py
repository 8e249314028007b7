"""Short questions to another interpreter (a layered env's versions, its torch build) asked inside the
sandbox. Starting an env's interpreter runs its site-packages' ``.pth`` files, and the wheels in a
layered env were chosen by the model: outside bwrap, that is the model's code running as the server.

``run_probe`` has ``subprocess.run``'s shape (text in, text out, a timeout) so call sites change by one
name. Under bwrap the probe sees the host read-only (sandbox/isolation/bwrap.py's allow-list, the interpreter
bound back), no network, no privilege, nothing writable but a private /tmp. Where bwrap is not usable
and process isolation was chosen, it runs as a plain subprocess (as every run does in that mode).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from knowledge.errors import IsolationUnavailable
from sandbox.isolation.bwrap import bwrap_command
from sandbox.isolation.confine import seccomp_fd
from sandbox.isolation.process import Limits, Mounts, bwrap_available, scrubbed_env


@functools.lru_cache(maxsize=1)
def _bwrap() -> str | None:
    return bwrap_available()


def run_probe(argv: list[str], *, input: str | None = None, timeout: float = 60.0,  # noqa: A002
              env: dict[str, str] | None = None, readable: tuple[Path, ...] = (),
              writable: tuple[Path, ...] = (), interpreters: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` confined; ``env`` adds to the scrubbed environment; ``readable`` / ``writable`` are
    bound in (read-only / read-write), ``interpreters`` (besides ``argv[0]``) with their environments.
    Raises ``subprocess.TimeoutExpired`` like subprocess.run."""
    from knowledge.settings import settings

    run_env = scrubbed_env(env)
    choice = settings().isolation_choice  # NPUPORT_ISOLATION: auto | bwrap | process
    bwrap = None if choice == "process" else _bwrap()
    if bwrap is None:
        if choice == "bwrap":
            raise IsolationUnavailable("bwrap is required (NPUPORT_ISOLATION=bwrap) and not usable here")
        return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=run_env)
    fd = seccomp_fd()
    try:
        mounts = Mounts(ro=tuple(p for p in readable if p.exists()), rw=writable, interpreters=interpreters)
        cmd = bwrap_command(bwrap, argv, cwd=Path("/tmp"), mounts=mounts,
                            limits=Limits(wall_s=timeout, tmpfs_mb=256), filter_fd=fd)
        return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=run_env,
                              pass_fds=() if fd is None else (fd,))
    finally:
        if fd is not None:
            os.close(fd)
