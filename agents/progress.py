"""Progress inside an agent step (a tuning trial started, its result): sent on LangGraph's ``custom``
stream so the CLI's live display and the service's events show work between node updates. Outside a
graph run (a plain function call, a test) it does nothing."""

from __future__ import annotations

from typing import Any


def emit(kind: str, **data: Any) -> None:
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except Exception:  # not inside a graph run
        return
    try:
        writer({"kind": kind, **data})
    except Exception:  # progress is best-effort; it must never fail a port
        return
