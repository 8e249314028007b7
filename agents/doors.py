"""One front-door policy for the folders a port reads and writes, held by the planner whatever door the
request came through (docs/security.md, "Front doors").

A process that serves others (``npuport serve``, ``langgraph dev`` with npuport's langgraph.json) marks
itself with :func:`mark_service` (an environment variable, so the workers it starts inherit it), and every
job of the service runs in :func:`serving`. There a port's model folder must resolve (symlinks followed)
inside a model root of ``NPUPORT_ALLOWED_ROOTS`` or one of npuport's own folders that hold what the service
staged (uploads, a batch's staged copies), and its output folder inside the home or a root: neither a request
field nor the goal text (read by rules or by an LLM) can name another folder of the host. The CLI, run by the user on
their own folders, is not confined.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from pathlib import Path

from knowledge.settings import ServiceSettings, set_environment

SERVICE_ENV = "NPUPORT_SERVICE_PROCESS"
_serving: contextvars.ContextVar[tuple[tuple[Path, ...], Path] | None] = contextvars.ContextVar(
    "npuport_serving", default=None)
STAGED = ("uploads", "batches")
"""Folders of the home where the service itself puts models it was sent (uploads, a batch's staged copies)."""


def mark_service() -> None:
    """This process (and what it starts) serves requests of others: the planner confines their paths.
    Called by the processes that only serve (``npuport serve``, ``langgraph dev``'s graph and app modules)."""
    set_environment({SERVICE_ENV: "1"})


@contextlib.contextmanager
def serving(roots: list[Path] | tuple[Path, ...], home: Path) -> Iterator[None]:
    """A job of the service runs in here (api/jobs.py), under that service's roots and home: its ports are
    confined even in a process that does other things too (a test runner that builds the app in-process)."""
    token = _serving.set((tuple(Path(r).expanduser().resolve() for r in roots), Path(home).resolve()))
    try:
        yield
    finally:
        _serving.reset(token)


def is_service() -> bool:
    return ServiceSettings().service_process or _serving.get() is not None


def _policy() -> tuple[list[Path], Path] | None:
    """(the model roots, the home) this port is confined to, or None (the CLI: the user's own folders)."""
    job = _serving.get()
    if job is not None:
        return list(job[0]), job[1]
    conf = ServiceSettings()
    if not conf.service_process:
        return None
    return [r.expanduser().resolve() for r in conf.allowed_roots], conf.resolved_home()


def _inside(path: Path, roots: list[Path]) -> bool:
    real = path.expanduser().resolve()
    return any(real == r or r in real.parents for r in roots)


def path_problem(model_path: str, out_dir: str | None) -> str | None:
    """Why a port of ``model_path`` writing to ``out_dir`` may not run in this process, or None."""
    policy = _policy()
    if policy is None:
        return None
    roots, home = policy
    staged = [home / name for name in STAGED]
    if "\x00" in model_path or not _inside(Path(model_path), roots + staged):
        where = ", ".join(map(str, roots)) or "none are configured (NPUPORT_ALLOWED_ROOTS): upload the model"
        return f"model path {model_path} is outside the allowed model roots ({where})"
    if out_dir and ("\x00" in out_dir or not _inside(Path(out_dir), [home, *roots])):
        return f"output folder {out_dir} is outside npuport's home and the model roots"
    return None
