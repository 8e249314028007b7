"""Batch state in SQLite (``<npuport home>/batches.sqlite``, WAL): batches, their ports, every
attempt, and an event log. Each process (driver, Ray task, API) opens its own connection.

Exactly-once, in short: the driver *claims* a port before it runs it (one atomic UPDATE that gives
the port a fresh attempt id), the task *begins* only while its attempt is still the port's current
one, and the task itself *completes* the port (status + result in one UPDATE guarded by the attempt
id). A result once written is never overwritten, so a re-run batch skips it; a claim whose task died
before writing a result is claimed again on resume, with the same LangGraph thread, so the port
continues from its last durable checkpoint rather than starting over.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knowledge.home import npuport_home

FINISHED = ("validated", "failed")
PORT_STATUSES = ("queued", "running", *FINISHED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    status TEXT NOT NULL, spec TEXT NOT NULL, out_dir TEXT NOT NULL, reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS ports (
    batch_id TEXT NOT NULL, key TEXT NOT NULL, pos INTEGER NOT NULL, spec TEXT NOT NULL,
    status TEXT NOT NULL, attempt_id TEXT, attempts INTEGER NOT NULL DEFAULT 0, thread_id TEXT,
    claimed REAL, started REAL, finished REAL, reason TEXT NOT NULL DEFAULT '', result TEXT,
    PRIMARY KEY (batch_id, key)
);
CREATE TABLE IF NOT EXISTS attempts (
    id TEXT PRIMARY KEY, batch_id TEXT NOT NULL, key TEXT NOT NULL, thread_id TEXT NOT NULL,
    claimed REAL NOT NULL, started REAL, finished REAL, outcome TEXT, pid INTEGER
);
CREATE TABLE IF NOT EXISTS events (
    batch_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, data TEXT NOT NULL, t REAL NOT NULL,
    PRIMARY KEY (batch_id, seq)
);
"""


def batch_db() -> Path:
    return npuport_home() / "batches.sqlite"


@dataclass
class PortRow:
    batch_id: str
    key: str
    pos: int
    spec: dict[str, Any]
    status: str
    attempt_id: str | None
    attempts: int
    thread_id: str | None
    claimed: float | None
    started: float | None
    finished: float | None
    reason: str
    result: dict[str, Any] | None


@dataclass
class BatchRow:
    id: str
    name: str
    owner: str
    created: float
    updated: float
    status: str
    spec: dict[str, Any]
    out_dir: str
    reason: str


@dataclass
class Claim:
    attempt_id: str
    thread_id: str
    resumed: bool
    """True when the port was claimed again after its task died: the thread continues from its checkpoint."""


class BatchStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or batch_db()
        # autocommit (isolation_level=None): each statement is its own transaction unless we open one
        self._conn = sqlite3.connect(str(self.path), timeout=60, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        self._conn.close()

    # batches -------------------------------------------------------------------------------------
    def ensure_batch(self, batch_id: str, name: str, owner: str, spec: dict[str, Any], out_dir: str,
                     ports: list[tuple[str, dict[str, Any]]]) -> bool:
        """Create the batch and its queued ports unless it exists; True when created now."""
        now = time.time()
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO batches (id, name, owner, created, updated, status, spec, out_dir)"
                " VALUES (?,?,?,?,?,?,?,?)", (batch_id, name, owner, now, now, "queued", json.dumps(spec), out_dir))
            created = cur.rowcount == 1
            for pos, (key, pspec) in enumerate(ports):
                self._conn.execute("INSERT OR IGNORE INTO ports (batch_id, key, pos, spec, status) VALUES (?,?,?,?,?)",
                                   (batch_id, key, pos, json.dumps(pspec), "queued"))
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return created

    def set_batch(self, batch_id: str, status: str, reason: str = "") -> None:
        self._conn.execute("UPDATE batches SET status=?, reason=?, updated=? WHERE id=?",
                           (status, reason, time.time(), batch_id))

    def batch(self, batch_id: str) -> BatchRow | None:
        r = self._conn.execute("SELECT * FROM batches WHERE id=?", (batch_id,)).fetchone()
        return _batch(r) if r else None

    def list_batches(self, owner: str | None = None, limit: int = 50) -> list[BatchRow]:
        q, args = "SELECT * FROM batches", []
        if owner is not None:
            q, args = q + " WHERE owner=?", [owner]
        rows = self._conn.execute(q + " ORDER BY created DESC LIMIT ?", (*args, limit)).fetchall()
        return [_batch(r) for r in rows]

    # ports ---------------------------------------------------------------------------------------
    def ports(self, batch_id: str) -> list[PortRow]:
        rows = self._conn.execute("SELECT * FROM ports WHERE batch_id=? ORDER BY pos", (batch_id,)).fetchall()
        return [_port(r) for r in rows]

    def port(self, batch_id: str, key: str) -> PortRow | None:
        r = self._conn.execute("SELECT * FROM ports WHERE batch_id=? AND key=?", (batch_id, key)).fetchone()
        return _port(r) if r else None

    def cancel_queued(self, batch_id: str, key: str, reason: str) -> bool:
        """A port not started yet ends as failed with ``reason`` (the batch was cancelled)."""
        cur = self._conn.execute("UPDATE ports SET status='failed', reason=?, finished=? WHERE batch_id=? AND key=?"
                                 " AND status='queued'", (reason, time.time(), batch_id, key))
        return cur.rowcount == 1

    def requeue_failed(self, batch_id: str) -> int:
        """--retry-failed: failed ports go back to the queue (their results are kept in attempts)."""
        cur = self._conn.execute("UPDATE ports SET status='queued', reason='retrying' WHERE batch_id=? AND "
                                 "status='failed'",
                                 (batch_id,))
        return cur.rowcount

    def claim(self, batch_id: str, key: str) -> Claim | None:
        """Take a queued port, or one left ``running`` by a driver that died, for a new attempt; None when
        the port is finished or someone else took it first (compare-and-swap on the attempt id)."""
        row = self.port(batch_id, key)
        if row is None or row.status not in ("queued", "running"):
            return None
        resumed = row.status == "running" and row.thread_id is not None
        thread = row.thread_id if resumed else f"batch-{batch_id}-{key}-{row.attempts + 1}"
        assert thread is not None
        attempt = uuid.uuid4().hex[:16]
        now = time.time()
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            cur = self._conn.execute(
                "UPDATE ports SET status='running', attempt_id=?, attempts=attempts+1, thread_id=?, claimed=?,"
                " started=NULL, reason='' WHERE batch_id=? AND key=? AND status IN ('queued','running')"
                " AND attempt_id IS ?", (attempt, thread, now, batch_id, key, row.attempt_id))
            if cur.rowcount != 1:
                self._conn.execute("ROLLBACK")
                return None
            self._conn.execute("INSERT INTO attempts (id, batch_id, key, thread_id, claimed) VALUES (?,?,?,?,?)",
                               (attempt, batch_id, key, thread, now))
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return Claim(attempt_id=attempt, thread_id=thread, resumed=resumed)

    def begin(self, attempt_id: str, pid: int) -> bool:
        """The task starts: only while its attempt is still the port's current, unfinished one."""
        now = time.time()
        cur = self._conn.execute("UPDATE ports SET started=? WHERE attempt_id=? AND status='running'",
                                 (now, attempt_id))
        if cur.rowcount == 1:
            self._conn.execute("UPDATE attempts SET started=?, pid=? WHERE id=?", (now, pid, attempt_id))
        return cur.rowcount == 1

    def complete(self, attempt_id: str, status: str, reason: str, result: dict[str, Any]) -> bool:
        """Record the port's result, once: True when this call wrote it."""
        if status not in FINISHED:
            raise ValueError(f"not a finished status: {status}")
        now = time.time()
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            cur = self._conn.execute(
                "UPDATE ports SET status=?, reason=?, result=?, finished=? WHERE attempt_id=? AND status='running'",
                (status, reason, json.dumps(result, default=str), now, attempt_id))
            if cur.rowcount == 1:
                self._conn.execute("UPDATE attempts SET finished=?, outcome=? WHERE id=?", (now, status, attempt_id))
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return cur.rowcount == 1

    def attempts(self, batch_id: str, key: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM attempts WHERE batch_id=?", [batch_id]
        if key is not None:
            q, args = q + " AND key=?", [*args, key]
        return [dict(r) for r in self._conn.execute(q + " ORDER BY claimed", args).fetchall()]

    # events --------------------------------------------------------------------------------------
    def add_event(self, batch_id: str, kind: str, data: dict[str, Any]) -> int:
        now = time.time()
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            seq = int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE batch_id=?",
                                         (batch_id,)).fetchone()[0])
            self._conn.execute("INSERT INTO events (batch_id, seq, kind, data, t) VALUES (?,?,?,?,?)",
                               (batch_id, seq, kind, json.dumps(data, default=str), now))
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return seq

    def events(self, batch_id: str, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._conn.execute("SELECT seq, kind, data, t FROM events WHERE batch_id=? AND seq>? ORDER BY "
                                  "seq LIMIT ?",
                                  (batch_id, after, limit)).fetchall()
        return [{"seq": r["seq"], "kind": r["kind"], "t": r["t"], "data": json.loads(r["data"])} for r in rows]


def _batch(r: sqlite3.Row) -> BatchRow:
    return BatchRow(id=r["id"], name=r["name"], owner=r["owner"], created=r["created"], updated=r["updated"],
                    status=r["status"], spec=json.loads(r["spec"]), out_dir=r["out_dir"], reason=r["reason"])


def _port(r: sqlite3.Row) -> PortRow:
    return PortRow(batch_id=r["batch_id"], key=r["key"], pos=r["pos"], spec=json.loads(r["spec"]), status=r["status"],
                   attempt_id=r["attempt_id"], attempts=r["attempts"], thread_id=r["thread_id"], claimed=r["claimed"],
                   started=r["started"], finished=r["finished"], reason=r["reason"],
                   result=json.loads(r["result"]) if r["result"] else None)
