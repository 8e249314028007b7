"""Porting jobs: a SQLite job store, its event log, and a bounded worker pool.

Each job is one LangGraph thread (thread id = job id) checkpointed in ``checkpoints.sqlite``
under the npuport home; job records and events live in ``service.sqlite`` beside it. Nothing
is kept only in memory: after a crash, ``JobManager.start`` resumes every queued or running
job from its last checkpoint. Agent steps are published from the checkpointer
(graph/jobs_support.py), so the ``step`` events of a job are always exactly the durable trace of
its thread: none lost, none repeated, whatever the moment of a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.request import request_of
from agents.state import bundle_of, reason_of, status_of
from api import shares
from knowledge.errors import JobError, first_line
from knowledge.settings import ServiceSettings as Settings

TERMINAL = frozenset({"validated", "failed", "cancelled"})
CRASH_RESUME = "the service died while this job ran; resuming it once"
QUARANTINED = ("quarantined: the service died while this job ran, again after it was resumed; it is not resumed "
               "a second time (its model may be what kills the service)")
MAX_CRASH_RESUMES = 1
STATUSES = ("queued", "running", "awaiting_approval", *sorted(TERMINAL))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL, status TEXT NOT NULL,
    goal TEXT NOT NULL, request TEXT NOT NULL, require_approval INTEGER NOT NULL DEFAULT 0,
    owner TEXT NOT NULL, idem_key TEXT, idem_digest TEXT, conversation TEXT, reason TEXT NOT NULL DEFAULT '',
    bundle_dir TEXT, upload_dir TEXT, started INTEGER NOT NULL DEFAULT 0,
    UNIQUE (owner, idem_key)
);
CREATE TABLE IF NOT EXISTS events (
    job_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, step INTEGER, data TEXT NOT NULL,
    t REAL NOT NULL, PRIMARY KEY (job_id, seq), UNIQUE (job_id, step)
);
CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, job_id TEXT NOT NULL, updated REAL NOT NULL);
"""


@dataclass
class Job:
    id: str
    created: float
    updated: float
    status: str
    goal: str
    request: dict[str, Any]
    require_approval: bool
    owner: str
    conversation: str | None
    reason: str
    bundle_dir: str | None
    upload_dir: str | None
    started: bool
    idem_digest: str | None = None

    def public(self, step_count: int = 0) -> dict[str, Any]:
        return {
            "id": self.id, "status": self.status, "reason": self.reason, "goal": self.goal,
            "request": self.request, "require_approval": self.require_approval,
            "created": self.created, "updated": self.updated, "conversation": self.conversation,
            "steps": step_count,
            "events_url": f"/v1/ports/{self.id}/events",
            "bundle_url": f"/v1/ports/{self.id}/bundle" if self.bundle_dir and self.status in TERMINAL else None,
        }


@dataclass
class Event:
    seq: int
    kind: str
    data: dict[str, Any]
    t: float


def body_digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class JobStore:
    """Job records and their event log (SQLite, one connection guarded by a lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=60, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @staticmethod
    def _job(row: sqlite3.Row) -> Job:
        return Job(id=row["id"], created=row["created"], updated=row["updated"], status=row["status"],
                   goal=row["goal"], request=json.loads(row["request"]), require_approval=bool(row["require_approval"]),
                   owner=row["owner"], conversation=row["conversation"], reason=row["reason"],
                   bundle_dir=row["bundle_dir"], upload_dir=row["upload_dir"], started=bool(row["started"]),
                   idem_digest=row["idem_digest"])

    def create(self, job: Job, idem_key: str | None) -> tuple[Job, bool]:
        """Insert ``job``; with an idempotency key already used by this owner, return that job instead."""
        with self._lock:
            if idem_key:
                row = self._conn.execute("SELECT * FROM jobs WHERE owner=? AND idem_key=?",
                                         (job.owner, idem_key)).fetchone()
                if row is not None:
                    return self._job(row), False
            self._conn.execute(
                "INSERT INTO jobs (id, created, updated, status, goal, request, require_approval, owner, idem_key,"
                " idem_digest, conversation, reason, bundle_dir, upload_dir, started)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job.id, job.created, job.updated, job.status, job.goal, json.dumps(job.request),
                 int(job.require_approval),
                 job.owner, idem_key, job.idem_digest, job.conversation, job.reason, job.bundle_dir, job.upload_dir,
                 int(job.started)))
        return job, True

    def find_idem(self, owner: str, idem_key: str) -> Job | None:
        with self._lock:
            row = self._conn.execute("SELECT * FROM jobs WHERE owner=? AND idem_key=?", (owner, idem_key)).fetchone()
        return self._job(row) if row else None

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return self._job(row) if row else None

    def list_jobs(self, limit: int = 50, status: str | None = None, owner: str | None = None) -> list[Job]:
        conds: list[str] = []
        args: list[Any] = []
        if status:
            conds, args = [*conds, "status=?"], [*args, status]
        if owner is not None:
            conds, args = [*conds, "owner=?"], [*args, owner]
        q = "SELECT * FROM jobs" + (" WHERE " + " AND ".join(conds) if conds else "")
        with self._lock:
            rows = self._conn.execute(q + " ORDER BY created DESC LIMIT ?", (*args, limit)).fetchall()
        return [self._job(r) for r in rows]

    def with_status(self, statuses: tuple[str, ...]) -> list[Job]:
        marks = ",".join("?" * len(statuses))
        with self._lock:
            rows = self._conn.execute(f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY created",
                                      statuses).fetchall()
        return [self._job(r) for r in rows]

    def count(self, statuses: tuple[str, ...], owner: str | None = None) -> int:
        marks = ",".join("?" * len(statuses))
        mine, args = (" AND owner=?", (*statuses, owner)) if owner is not None else ("", statuses)
        with self._lock:
            return int(self._conn.execute(f"SELECT COUNT(*) FROM jobs WHERE status IN ({marks}){mine}",
                                          args).fetchone()[0])

    def update(self, job_id: str, **fields: Any) -> None:
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._lock:
            self._conn.execute(f"UPDATE jobs SET {cols} WHERE id=?", (*fields.values(), job_id))

    def transition(self, job_id: str, from_statuses: tuple[str, ...], **fields: Any) -> bool:
        """Set ``fields`` only while the job is in one of ``from_statuses`` (one atomic UPDATE); True when
        this call made the change. Concurrent approve/cancel/start calls race here, and one wins."""
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        marks = ",".join("?" * len(from_statuses))
        with self._lock:
            cur = self._conn.execute(f"UPDATE jobs SET {cols} WHERE id=? AND status IN ({marks})",
                                     (*fields.values(), job_id, *from_statuses))
            return cur.rowcount == 1

    def add_event(self, job_id: str, kind: str, data: dict[str, Any], step: int | None = None) -> Event | None:
        """Append an event; a step already recorded (same index) is not added again (returns None)."""
        now = time.time()
        with self._lock:
            if step is not None and self._conn.execute(
                    "SELECT 1 FROM events WHERE job_id=? AND step=?", (job_id, step)).fetchone():
                return None
            seq = int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE job_id=?",
                                         (job_id,)).fetchone()[0])
            self._conn.execute("INSERT INTO events (job_id, seq, kind, step, data, t) VALUES (?,?,?,?,?,?)",
                               (job_id, seq, kind, step, json.dumps(data, default=str), now))
        return Event(seq=seq, kind=kind, data=data, t=now)

    def events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[Event]:
        with self._lock:
            rows = self._conn.execute("SELECT seq, kind, data, t FROM events WHERE job_id=? AND seq>? ORDER BY "
                                      "seq LIMIT ?",
                                      (job_id, after, limit)).fetchall()
        return [Event(seq=r["seq"], kind=r["kind"], data=json.loads(r["data"]), t=r["t"]) for r in rows]

    def step_count(self, job_id: str) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM events WHERE job_id=? AND kind='step'",
                                          (job_id,)).fetchone()[0])

    def bind_conversation(self, conversation: str, job_id: str) -> None:
        with self._lock:
            self._conn.execute("INSERT INTO conversations (id, job_id, updated) VALUES (?,?,?) ON CONFLICT(id) "
                               "DO UPDATE SET job_id=excluded.job_id, updated=excluded.updated",
                               (conversation, job_id, time.time()))

    def conversation_job(self, conversation: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT job_id FROM conversations WHERE id=?", (conversation,)).fetchone()
        return row["job_id"] if row else None


Runner = Callable[..., Any]
"""graph.jobs_support.run_thread, or a stand-in with its signature."""


def new_job_id(model_path: str) -> str:
    from agents.request import new_run_id

    return new_run_id(model_path)


class JobManager:
    """Runs jobs in a bounded thread pool; publishes events to the store and to async listeners."""

    def __init__(self, settings: Settings, store: JobStore, builder: Any = None) -> None:
        self.settings = settings
        self.store = store
        self.home = settings.resolved_home()
        self.builder = builder
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: dict[str, set[asyncio.Event]] = {}
        self._cancel: set[str] = set()
        self._shutdown = threading.Event()
        self._start_lock = threading.Lock()
        self._share_lock = threading.Lock()

    # lifecycle ---------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the pool (idempotent) and resume what a crash or a restart left unfinished."""
        with self._start_lock:
            if loop is not None:
                self._loop = loop
            if self._pool is not None:
                return
            self._pool = ThreadPoolExecutor(max_workers=self.settings.workers, thread_name_prefix="npuport-job")
            # Runs left by a server killed with SIGKILL die before their jobs resume (never two at once).
            from sandbox.isolation.process import register_secret
            from sandbox.isolation.reaper import reap_orphans

            reap_orphans()
            for token in self.settings.tokens:  # API tokens never appear in what a run hands back
                register_secret(token)
            clean = self._clean_stop_marker()
            crashed = not clean.exists()
            clean.unlink(missing_ok=True)
            for job in self.store.with_status(("queued", "running")):
                if job.status == "running":
                    if crashed and self._crash_resumes(job.id) >= MAX_CRASH_RESUMES:
                        # It was running at every one of these service deaths: it may be what kills the
                        # service (a parser crash, a memory bomb). Resuming it again would kill it again.
                        self._finish(job.id, "failed", QUARANTINED)
                        continue
                    reason = CRASH_RESUME if crashed else "service restarted; resuming"
                    self._event(job.id, "status", {"status": "queued", "reason": reason})
                    self.store.update(job.id, status="queued")
                self._pool.submit(self._run, job.id)

    def _clean_stop_marker(self) -> Path:
        return self.home / "service-stopped-cleanly"

    def _crash_resumes(self, job_id: str) -> int:
        return sum(1 for e in self.store.events(job_id, 0, 100_000)
                   if e.kind == "status" and e.data.get("reason") == CRASH_RESUME)

    def stop(self) -> None:
        """Stop taking work; running jobs stop at their next step and stay resumable (status kept)."""
        self._shutdown.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):  # the next start tells a clean stop from a crash by this file
            self._clean_stop_marker().write_text(str(time.time()))

    def pool_submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in the service's worker pool (a batch's port: graph/batch/executors.py PoolExecutor)."""
        from agents.doors import serving

        def in_service() -> Any:
            with serving(self.settings.allowed_roots, self.home):  # confined like a job (agents/doors.py)
                return fn(*args)

        self.start()
        assert self._pool is not None
        return self._pool.submit(in_service)

    # commands -----------------------------------------------------------------------------------
    def submit(self, job: Job, idem_key: str | None = None) -> tuple[Job, bool]:
        shares.check_queue(self.store, self.settings, job.owner)  # the queue, and this owner's share of it
        stored, created = self.store.create(job, idem_key)
        if created:
            self._event(job.id, "status", {"status": "queued", "reason": ""})
            self.start()
            assert self._pool is not None
            self._pool.submit(self._run, job.id)
        return stored, created

    def cancel(self, job_id: str) -> Job:
        job = self._must(job_id)
        if job.status in TERMINAL:
            raise JobError(f"job {job_id} already ended ({job.status})")
        reason = "cancelled by the user"
        if self.store.transition(job_id, ("queued", "awaiting_approval"), status="cancelled", reason=reason):
            self._event(job_id, "status", {"status": "cancelled", "reason": reason, "bundle": False})
            self._cancel.discard(job_id)
            shares.drop_upload(self.home, job.upload_dir)
            return self._must(job_id)
        job = self._must(job_id)  # it moved meanwhile: started running, or ended
        if job.status in TERMINAL:
            raise JobError(f"job {job_id} already ended ({job.status})")
        # a running graph stops after its current agent step (it checks between steps)
        self._cancel.add(job_id)
        self._event(job_id, "status", {"status": "cancelling", "reason": "cancel requested"})
        return self._must(job_id)

    def approve(self, job_id: str) -> Job:
        self._must(job_id)  # 404 for an unknown job
        if not self.store.transition(job_id, ("awaiting_approval",), status="queued"):
            job = self._must(job_id)
            raise JobError(f"job {job_id} is not waiting for approval (status {job.status})")
        self._event(job_id, "status", {"status": "queued", "reason": "approved"})
        self.start()
        assert self._pool is not None
        self._pool.submit(self._run, job_id, True)
        return self._must(job_id)

    # events -------------------------------------------------------------------------------------
    def listen(self, job_id: str) -> asyncio.Event:
        ev = asyncio.Event()
        self._listeners.setdefault(job_id, set()).add(ev)
        return ev

    def unlisten(self, job_id: str, ev: asyncio.Event) -> None:
        self._listeners.get(job_id, set()).discard(ev)

    def _wake(self, job_id: str) -> None:
        for ev in list(self._listeners.get(job_id, ())):
            ev.set()

    def _event(self, job_id: str, kind: str, data: dict[str, Any], step: int | None = None) -> None:
        if self.store.add_event(job_id, kind, data, step) is None:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(self._wake, job_id)

    def _publish_trace(self, job_id: str, trace: list[dict[str, Any]]) -> None:
        # step indexes are positions in the durable trace; add_event skips those already stored
        for i in range(self.store.step_count(job_id), len(trace)):
            item = trace[i]
            self._event(job_id, "step", {"step": i, "node": item.get("node", item.get("agent")), **item}, step=i)

    # the worker ---------------------------------------------------------------------------------
    def _must(self, job_id: str) -> Job:
        job = self.store.get(job_id)
        if job is None:
            raise JobError(f"no job {job_id}", 404)
        return job

    def _finish(self, job_id: str, status: str, reason: str, bundle_dir: str | None = None) -> None:
        fields: dict[str, Any] = {"status": status, "reason": reason}
        if bundle_dir:
            fields["bundle_dir"] = bundle_dir
        self.store.update(job_id, **fields)
        self._event(job_id, "status", {"status": status, "reason": reason, "bundle": bool(bundle_dir)})
        self._cancel.discard(job_id)
        job = self.store.get(job_id)
        shares.drop_upload(self.home, job.upload_dir if job else None)  # the workspace holds its copy

    def _run(self, job_id: str, approved: bool = False) -> None:
        try:
            self._run_job(job_id, approved)
        except Exception as exc:  # e.g. a corrupt checkpoint database before the graph starts: never stuck "queued"
            self._finish(job_id, "failed", f"internal error: {type(exc).__name__}: {first_line(exc)}")

    def _run_job(self, job_id: str, approved: bool) -> None:
        from graph.jobs_support import run_thread, thread_snapshot

        job = self.store.get(job_id)
        if job is None or job.status != "queued" or self._shutdown.is_set():
            return
        db = self.home / "checkpoints.sqlite"
        snap = thread_snapshot(job_id, builder=self.builder, db_path=db) if job.started else None
        if snap is not None and not snap.next:  # the graph ended before the crash; only the record lagged
            self._publish_trace(job_id, snap.trace)
            self._conclude(job_id, snap.values)
            return
        if problem := shares.memory_problem(self.settings):
            self._finish(job_id, "failed", problem)
            return
        if snap is not None and job.require_approval and not approved and "patcher" in snap.next:
            # paused at the approval gate when the service went down: ask again, never skip it
            self._publish_trace(job_id, snap.trace)
            self.store.update(job_id, status="awaiting_approval", reason="waiting for approval of the next patch round")
            self._event(job_id, "status",
                        {"status": "awaiting_approval", "reason": "approve to apply the next patches"})
            return
        with self._share_lock:  # the owner's running share, checked and taken at once
            if not shares.may_start(self.store, self.settings, job.owner):
                self._retry_later(job_id, approved)
                return
            if not self.store.transition(job_id, ("queued",), status="running", started=1):
                return  # cancelled (or taken by another worker) since it was read
        self._event(job_id, "status", {"status": "running", "reason": "resumed" if snap else ""})
        inputs = None if snap is not None else {"goal": job.goal, "request": job.request}
        from agents.doors import serving
        from knowledge.port_memory import memory_owner
        from sandbox.isolation.process import stop_runs_when

        stop = lambda: job_id in self._cancel or self._shutdown.is_set()  # noqa: E731
        try:
            # a cancel kills the sandbox run in flight, not only the next step; what the port learns is its owner's
            with stop_runs_when(stop), memory_owner(job.owner), serving(self.settings.allowed_roots, self.home):
                result = run_thread(
                    inputs, job_id,
                    on_trace=lambda trace: self._publish_trace(job_id, trace),
                    should_stop=stop,
                    interrupt_before=("patcher",) if job.require_approval else (),
                    builder=self.builder, db_path=db,
                    on_progress=lambda kind, data: self._event(job_id, "progress", {"kind": kind, **data}))
        except Exception as exc:  # a bug or a broken environment: the job fails with the reason, the service lives
            self._finish(job_id, "failed", f"internal error: {type(exc).__name__}: {first_line(exc)}")
            return
        self._publish_trace(job_id, result.trace)
        if job_id in self._cancel:
            self._finish(job_id, "cancelled", "cancelled by the user")
        elif result.stopped:
            return  # shutdown: the record stays "running" and start() resumes it
        elif result.next and status_of(result.values) not in TERMINAL:
            self.store.update(job_id, status="awaiting_approval", reason="waiting for approval of the next patch round")
            self._event(job_id, "status", {"status": "awaiting_approval", "reason": "approve to apply the next patches",
                                           "next": list(result.next)})
        else:
            self._conclude(job_id, result.values)

    def _retry_later(self, job_id: str, approved: bool, delay_s: float = 0.5) -> None:
        """Queue the job again behind the others (its owner's running share is full now)."""
        def again() -> None:
            if self._pool is not None and not self._shutdown.is_set():
                with contextlib.suppress(RuntimeError):  # the pool shut down meanwhile
                    self._pool.submit(self._run, job_id, approved)

        timer = threading.Timer(delay_s, again)
        timer.daemon = True
        timer.start()

    def _conclude(self, job_id: str, values: dict[str, Any]) -> None:
        status = status_of(values) if status_of(values) in ("validated", "failed") else "failed"
        self._finish(job_id, status, reason_of(values) or status, bundle_dir=bundle_of(values).dir or None)


def make_job(*, goal: str, request: dict[str, Any], owner: str, require_approval: bool = False,
             conversation: str | None = None, upload_dir: str | None = None, home: Path,
             digest: str | None = None, job_id: str | None = None) -> Job:
    """A new queued job; its bundle goes to <home>/jobs/<id>/bundle (the server picks, never the client)."""
    jid = job_id or new_job_id(request_of(request).model_path or "model")
    req = dict(request)
    req["out_dir"] = str(home / "jobs" / jid / "bundle")
    now = time.time()
    return Job(id=jid, created=now, updated=now, status="queued", goal=goal, request=req,
               require_approval=require_approval, owner=owner, conversation=conversation, reason="",
               bundle_dir=None, upload_dir=upload_dir, started=False, idem_digest=digest)
