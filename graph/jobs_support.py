"""Running a port as a crash-safe, observable job (used by the HTTP service, api/jobs.py).

Why not ``graph.runner.run_port``: a service must publish an agent step only once it is durable,
so that a crash never shows a step that then runs again, nor loses one that will not. Here every
step is published from the checkpointer itself, right after the checkpoint that holds it is
written: the published steps are always a prefix of the thread's durable ``trace``. The run also
stops cooperatively (cancel, shutdown) between agent steps and can pause before the patcher so a
human approves each patch round (LangGraph ``interrupt_before``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import StateGraph

from agents.state import trace_of
from knowledge.home import npuport_home

TraceSink = Callable[[list[dict[str, Any]]], None]
"""Receives the whole durable trace after each checkpoint; it publishes the items it has not yet."""

GraphBuilder = Callable[[], StateGraph[Any]]


@dataclass
class ThreadResult:
    values: dict[str, Any]
    next: tuple[str, ...] = ()
    """Nodes still to run: non-empty when the run paused (approval) or was stopped."""
    stopped: bool = False
    trace: list[dict[str, Any]] = field(default_factory=list)
    pending_writes: bool = False
    """The last checkpoint holds writes of a step that ran but was never followed by the next checkpoint (the
    run stopped in between): ``next`` may then read empty, yet a resume applies them and goes on."""
    created_at: str | None = None


def checkpoint_db() -> Path:
    return npuport_home() / "checkpoints.sqlite"


def _connect(path: Path | None) -> sqlite3.Connection:
    # Several jobs (batch workers are processes) write checkpoints at once: WAL plus a busy timeout, and
    # autocommit, so no transaction that read turns into one that writes (in WAL that upgrade fails at once
    # with "database is locked" when another process wrote in between; the busy timeout does not cover it).
    conn = sqlite3.connect(str(path or checkpoint_db()), check_same_thread=False, timeout=60, isolation_level=None)
    for attempt in range(20):  # switching to WAL takes an exclusive lock once, when the file is new
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if attempt == 19:
                raise
            time.sleep(0.25 * (attempt + 1))
    return conn


class AtomicSqliteSaver(SqliteSaver):
    """A SqliteSaver whose every write is one transaction. On the autocommit connection above, SqliteSaver's
    ``put_writes`` (one executemany) committed row by row: a process killed in the middle left a node's writes
    half stored (its results without its routing), and the resumed thread then ended as if that node had
    finished with nowhere to go. ``BEGIN IMMEDIATE`` takes the write lock up front (no read-to-write upgrade)."""

    @contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        with self.lock:
            self.setup()
            cur = self.conn.cursor()
            try:
                if transaction:
                    cur.execute("BEGIN IMMEDIATE")
                yield cur
                if transaction:
                    cur.execute("COMMIT")
            except BaseException:
                if transaction and self.conn.in_transaction:
                    self.conn.rollback()
                raise
            finally:
                cur.close()


class PublishingSaver(AtomicSqliteSaver):
    """A SqliteSaver that hands the durable trace to ``sink`` after each top-level checkpoint."""

    def __init__(self, conn: sqlite3.Connection, sink: TraceSink | None) -> None:
        super().__init__(conn)
        self._sink = sink

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        out = super().put(config, checkpoint, metadata, new_versions)
        ns = (config.get("configurable") or {}).get("checkpoint_ns", "")
        values = checkpoint.get("channel_values") or {}  # the state as the checkpoint holds it
        if self._sink is not None and not ns and "trace" in values:
            self._sink(trace_of(values))
        return out


def _default_builder() -> StateGraph[Any]:
    from graph.builder import build_graph

    return build_graph()


def run_thread(
    inputs: dict[str, Any] | None,
    thread_id: str,
    on_trace: TraceSink | None = None,
    should_stop: Callable[[], bool] | None = None,
    interrupt_before: Sequence[str] = (),
    builder: GraphBuilder | None = None,
    db_path: Path | None = None,
    recursion_limit: int = 200,
    on_progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> ThreadResult:
    """Run (``inputs``) or resume (``inputs=None``, from the last checkpoint) one port thread.

    ``on_progress`` gets what happens inside a step, not durable, for live displays: ``("task",
    {"node"})`` as a node starts and the agents' own progress (agents/progress.py: tuning trials)."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}, "recursion_limit": recursion_limit}
    conn = _connect(db_path)
    try:
        saver = PublishingSaver(conn, on_trace)
        app = (builder or _default_builder)().compile(
            checkpointer=saver, interrupt_before=list(interrupt_before) or None, name="npuport")
        stopped = False
        # durability="sync": each checkpoint is written before the next step starts
        for mode, chunk in app.stream(inputs, config, stream_mode=["updates", "custom", "tasks"], durability="sync"):
            if mode == "tasks":
                if on_progress and isinstance(chunk, dict) and "input" in chunk:  # a start, not a result
                    on_progress("task", {"node": chunk.get("name")})
                continue
            if mode == "custom":
                if on_progress and isinstance(chunk, dict) and chunk.get("kind"):
                    on_progress(str(chunk["kind"]), {k: v for k, v in chunk.items() if k != "kind"})
                continue
            if should_stop and should_stop():  # between agent steps only
                stopped = True
                break
        snap = app.get_state(config)
        values = dict(snap.values)
        return ThreadResult(values=values, next=tuple(snap.next), stopped=stopped, trace=trace_of(values))
    finally:
        conn.close()


def thread_snapshot(thread_id: str, builder: GraphBuilder | None = None,
                    db_path: Path | None = None) -> ThreadResult | None:
    """The last checkpoint of a thread, or None when the thread never checkpointed."""
    conn = _connect(db_path)
    try:
        saver = AtomicSqliteSaver(conn)
        app = (builder or _default_builder)().compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        snap = app.get_state(config)
        if not snap.values and not snap.next:
            return None
        values = dict(snap.values)
        tup = saver.get_tuple(config)
        return ThreadResult(values=values, next=tuple(snap.next), trace=trace_of(values),
                            pending_writes=bool(tup and tup.pending_writes), created_at=snap.created_at)
    finally:
        conn.close()
