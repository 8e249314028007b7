"""Runs a port through the compiled graph with a SQLite checkpointer, streaming agent steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.request import request_of
from agents.state import counters_of, status_of, trace_of
from graph.builder import compile_graph

FINISHED = ("validated", "failed")


@dataclass(frozen=True)
class ThreadInfo:
    """A port thread in the checkpoint database, as `npuport resume` lists it."""

    thread_id: str
    model: str
    status: str
    next: tuple[str, ...]
    stopped_in: str
    updated: str


def resumable(snap: Any) -> bool:
    """A thread a resume would continue: a node is still to run, or a step's writes wait to be applied."""
    return bool(snap.next) or bool(snap.pending_writes and status_of(snap.values) not in FINISHED)


def thread_infos(limit: int = 20) -> list[ThreadInfo]:
    """The most recent port threads that a resume would continue, newest first."""
    from graph.jobs_support import _connect, checkpoint_db, thread_snapshot

    if not checkpoint_db().is_file():
        return []
    conn = _connect(None)
    try:
        rows = conn.execute("SELECT thread_id, MAX(checkpoint_id) AS last FROM checkpoints WHERE checkpoint_ns = '' "
                            "GROUP BY thread_id ORDER BY last DESC LIMIT ?", (limit * 5,)).fetchall()
    except Exception:  # an empty database has no table yet
        rows = []
    finally:
        conn.close()
    out: list[ThreadInfo] = []
    for thread_id, _ in rows:
        snap = thread_snapshot(str(thread_id))
        if snap is None or not resumable(snap):
            continue
        trace = snap.trace
        out.append(ThreadInfo(thread_id=str(thread_id),
                              model=request_of(snap.values).model_path or "?",
                              status=status_of(snap.values) or "running", next=snap.next,
                              stopped_in=str(snap.next[0] if snap.next else trace[-1].get("agent") if trace else "?"),
                              updated=str(snap.created_at or "")[:19].replace("T", " ")))
        if len(out) >= limit:
            break
    return out


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
    and the agents' own progress (``trial_start`` / ``trial_done`` from the tuner, ``phase`` lines of the
    deployment: agents/progress.py). Progress comes through a listener, not LangGraph's ``custom`` stream:
    with that stream LangGraph runs each node in a worker thread, where Ctrl-C never reaches it (the main
    thread's interrupt then waited for the node to end: a patcher took over 15 s to stop)."""
    from agents.progress import listening

    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit}
    listener = (lambda kind, data: on_event(kind, data)) if on_event else (lambda kind, data: None)
    with sqlite_checkpointer() as saver, listening(listener):
        app = compile_graph(checkpointer=saver)
        for mode, chunk in app.stream(inputs, config, stream_mode=["updates", "tasks"]):
            if mode == "tasks":
                if on_event and isinstance(chunk, dict) and "input" in chunk:  # a start, not a result
                    on_event("task", {"node": chunk.get("name")})
                continue
            for node, delta in chunk.items():
                if not isinstance(delta, dict):
                    continue
                # a node's update (a partial state) read like the state
                if on_event and "counters" in delta:
                    on_event("counters", counters_of(delta).model_dump())
                for item in trace_of(delta):
                    if on_step:
                        on_step({"node": node, **item})
        return dict(app.get_state(config).values)
