"""Runs a port through the compiled graph with a SQLite checkpointer, streaming agent steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graph.builder import compile_graph


@contextmanager
def sqlite_checkpointer(path: Path | None = None) -> Iterator[Any]:
    """The same database and connection settings as the service (WAL, busy timeout), so a CLI port and
    `npuport serve` can share one home."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from graph.jobs_support import _connect

    conn = _connect(path)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def run_port(
    inputs: dict[str, Any] | None,
    thread_id: str,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    recursion_limit: int = 200,
) -> dict[str, Any]:
    """Run (or, with ``inputs=None``, resume) the port of thread ``thread_id``; returns the final state."""
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit}
    with sqlite_checkpointer() as saver:
        app = compile_graph(checkpointer=saver)
        for update in app.stream(inputs, config, stream_mode="updates"):
            for node, delta in update.items():
                if not isinstance(delta, dict):
                    continue
                for item in delta.get("trace") or []:
                    if on_step:
                        on_step({"node": node, **item})
        return dict(app.get_state(config).values)
