"""Progress inside an agent step (a tuning trial started, its result, a phase of the deployment): sent to the
listeners a process registered (the CLI: one port per process, whose nodes then run in its main thread, where
Ctrl-C reaches them), else on LangGraph's ``custom`` stream (the service's events). Outside a graph run and
without a listener (a plain function call, a test) it does nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Listener = Callable[[str, dict[str, Any]], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """``listener(kind, data)`` gets every progress event of this process while the block runs."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def emit(kind: str, **data: Any) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(kind, {"kind": kind, **data})
        except Exception:  # progress is best-effort; it must never fail a port
            continue
    if listeners:
        return
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except Exception:  # not inside a graph run
        return
    try:
        writer({"kind": kind, **data})
    except Exception:  # progress is best-effort; it must never fail a port
        return
