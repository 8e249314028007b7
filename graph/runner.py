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
    from graph.jobs_support import AtomicSqliteSaver, _connect

    conn = _connect(path)
    try:
        yield AtomicSqliteSaver(conn)
    finally:
        conn.close()


def run_port(
    inputs: dict[str, Any] | None,
    thread_id: str,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    recursion_limit: int = 200,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run (or, with ``inputs=None``, resume) the port of thread ``thread_id``; returns the final state.

    ``on_step`` gets each agent step (trace item) as its node finishes; ``on_event`` gets what happens
    in between: ``("task", {"node"})`` when a node starts, ``("counters", {...})`` after a sandbox run,
    and the agents' own progress (``trial_start`` / ``trial_done`` from the tuner, agents/progress.py)."""
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit}
    with sqlite_checkpointer() as saver:
        app = compile_graph(checkpointer=saver)
        for mode, chunk in app.stream(inputs, config, stream_mode=["updates", "custom", "tasks"]):
            if mode == "tasks":
                if on_event and isinstance(chunk, dict) and "input" in chunk:  # a start, not a result
                    on_event("task", {"node": chunk.get("name")})
            elif mode == "custom":
                if on_event and isinstance(chunk, dict) and chunk.get("kind"):
                    on_event(str(chunk["kind"]), chunk)
            else:
                for node, delta in chunk.items():
                    if not isinstance(delta, dict):
                        continue
                    if on_event and delta.get("counters"):
                        on_event("counters", dict(delta["counters"]))
                    for item in delta.get("trace") or []:
                        if on_step:
                            on_step({"node": node, **item})
        return dict(app.get_state(config).values)
