"""One interrupt path for a port run from the CLI: the first Ctrl-C asks every part of the run to stop.

The CLI (api/cli_interrupt.py) calls ``request_stop()`` from its SIGINT handler. Whatever starts or
waits on new work checks ``stop_requested()`` / ``raise_if_stopped()``: a sandbox refuses to start and
kills the one that runs (sandbox/isolation/process.py polls it every 0.1 s), so tuning trials end within
seconds instead of starting new benchmark sandboxes. ``PortInterrupted`` derives from
KeyboardInterrupt, so no ``except Exception`` in a node or the tuner swallows it, and LangGraph keeps
the last checkpoint for a resume. Process-wide on purpose: one CLI process runs one port; the
service never calls ``request_stop`` (its jobs stop cooperatively, graph/jobs_support.py).
"""

from __future__ import annotations

import threading

_stop = threading.Event()


class PortInterrupted(KeyboardInterrupt):
    """The user interrupted the port (Ctrl-C); raised where running work was stopped."""


def request_stop() -> None:
    _stop.set()


def stop_requested() -> bool:
    return _stop.is_set()


def clear_stop() -> None:
    """For a new run in the same process (tests, a resume after an interrupt)."""
    _stop.clear()


def raise_if_stopped(what: str = "the port") -> None:
    if _stop.is_set():
        raise PortInterrupted(f"{what} was interrupted")
