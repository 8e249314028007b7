"""A node's writes reach the checkpoint database whole or not at all. The connection is in autocommit (WAL,
several writer processes), where LangGraph's SqliteSaver stored a node's writes row by row: a batch driver
killed with SIGKILL between two rows left the patcher's results without its routing, and the resumed thread
ended "failed: unknown reason" (seen in CI, tests/test_batch_ray.py's kill -9 test). A trigger that aborts
the second row stands in for the kill, deterministically."""

from __future__ import annotations

from pathlib import Path

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from graph.jobs_support import AtomicSqliteSaver, _connect

ABORT_SECOND_ROW = ("CREATE TRIGGER killed_between_rows BEFORE INSERT ON writes WHEN NEW.channel = 'branch:to:next' "
                    "BEGIN SELECT RAISE(ABORT, 'killed between rows'); END")


def _pending_after_an_interrupted_put_writes(saver: SqliteSaver) -> list[str]:
    saver.setup()
    saver.conn.execute(ABORT_SECOND_ROW)
    config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
    try:
        saver.put_writes(config, [("patches", [1]), ("branch:to:next", None)], task_id="patcher")
    except Exception as exc:  # the abort, as the kill would stop the process there
        assert "killed between rows" in str(exc)
    else:
        raise AssertionError("the trigger did not abort the write")
    tup = saver.get_tuple(config)
    assert tup is not None
    return [channel for _task, channel, _value in tup.pending_writes or []]


def test_a_nodes_writes_are_stored_whole_or_not_at_all(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "atomic.sqlite")
    try:
        assert _pending_after_an_interrupted_put_writes(AtomicSqliteSaver(conn)) == []
        # and it still writes: a whole set goes in as one
        saver = AtomicSqliteSaver(conn)
        config = saver.put({"configurable": {"thread_id": "u", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {})
        saver.put_writes(config, [("patches", [1]), ("trace", [])], task_id="patcher")
        tup = saver.get_tuple(config)
        assert tup is not None and [c for _t, c, _v in tup.pending_writes or []] == ["patches", "trace"]
    finally:
        conn.close()


def test_the_plain_saver_on_this_connection_keeps_half_a_nodes_writes(tmp_path: Path) -> None:
    # why the atomic saver exists: the same interruption with LangGraph's own saver keeps the first row
    conn = _connect(tmp_path / "plain.sqlite")
    try:
        assert _pending_after_an_interrupted_put_writes(SqliteSaver(conn)) == ["patches"]
    finally:
        conn.close()
