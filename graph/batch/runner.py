"""The batch driver: claims ports, hands them to an executor, kills those past their timeout, and
writes the results table. One driver per batch at a time (a file lock the kernel drops when the
driver dies, so a kill -9 never leaves the batch locked)."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from graph.batch.executors import Executor, LocalExecutor, PoolExecutor, RayExecutor, kill_tree, worker_alive
from graph.batch.manifest import PortSpec, ResolvedBatch
from graph.batch.results import memory_records, write_results
from graph.batch.store import FINISHED, BatchStore, PortRow
from knowledge.errors import BatchBusy, ExecutorError, first_line
from knowledge.home import npuport_home

ExecutorName = Literal["ray", "local", "pool"]


@dataclass
class BatchOptions:
    executor: ExecutorName = "ray"
    ray_address: str | None = None
    workers: int | None = None
    retry_failed: bool = False
    out_dir: Path | None = None
    owner: str = "local"
    poll_s: float = 0.5
    on_update: Callable[[BatchView], None] | None = None
    pool_submit: Callable[..., Any] | None = None
    """``pool``: hands a callable to the service's worker pool, returns its future (api/jobs.py)."""
    should_stop: Callable[[], bool] | None = None
    """The batch was cancelled: no port starts any more, those running are stopped, the queued ones fail."""


@dataclass
class BatchView:
    """What a progress display needs: the ports' rows and timing."""

    batch_id: str
    ports: list[PortRow]
    started: float
    workers: int
    executor: str
    finished_now: int = 0

    def eta_s(self) -> float | None:
        done = [p for p in self.ports if p.status in FINISHED and p.started is not None and p.finished is not None]
        left = [p for p in self.ports if p.status not in FINISHED]
        if not left:
            return 0.0
        if not done:
            return None
        mean = sum((p.finished or 0) - (p.started or 0) for p in done) / len(done)
        return mean * len(left) / max(1, min(self.workers, len(left)))


@dataclass
class BatchResult:
    batch_id: str
    out_dir: Path
    ports: list[PortRow]
    files: dict[str, Path] = field(default_factory=dict)
    executor: str = ""
    skipped: list[str] = field(default_factory=list)
    """Ports an earlier run of this batch had finished: not run again (the CLI says so)."""

    @property
    def ok(self) -> bool:
        return all(p.status == "validated" for p in self.ports)


def batch_dir(batch_id: str) -> Path:
    d = npuport_home() / "batches" / batch_id
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def driver_lock(batch_id: str) -> Iterator[None]:
    path = batch_dir(batch_id) / "driver.lock"
    fh = path.open("a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BatchBusy(f"batch {batch_id} is already running (another `npuport batch` holds {path})") from None
        yield
    finally:
        fh.close()


def register(resolved: ResolvedBatch, owner: str, out_dir: Path | None, store: BatchStore) -> tuple[str, Path]:
    """Create the batch in the store (idempotent: the id comes from the manifest's content)."""
    bid = resolved.batch_id
    existing = store.batch(bid)
    out = Path(existing.out_dir) if existing else (out_dir or Path.cwd() / "npuport-out" / bid).resolve()
    spec = {"name": resolved.name, "ports": [p.model_dump(mode="json") for p in resolved.ports],
            "memory_before": [r["id"] for r in memory_records(npuport_home())]}
    store.ensure_batch(bid, resolved.name, owner, spec, str(out),
                       [(p.key, p.model_dump(mode="json")) for p in resolved.ports])
    return bid, out


def make_executor(opts: BatchOptions, cpus_per_port: float, jobs_dir: Path) -> Executor:
    if opts.executor == "pool":
        if opts.pool_submit is None:
            raise ExecutorError("the pool executor runs in the service only (its worker pool)")
        return PoolExecutor(opts.pool_submit, opts.workers or 1)
    if opts.executor == "local":
        return LocalExecutor(opts.workers, jobs_dir)
    return RayExecutor(opts.ray_address, opts.workers, cpus_per_port)


def run_batch(resolved: ResolvedBatch, opts: BatchOptions) -> BatchResult:
    """Run (or resume) the batch to its end; returns the finished rows and the result files."""
    home = npuport_home()
    store = BatchStore()
    try:
        bid, out = register(resolved, opts.owner, opts.out_dir, store)
        with driver_lock(bid):
            return _drive(store, bid, out, home, opts)
    finally:
        store.close()


Inflight = dict[str, tuple[Any, float, str]]
"""The ports running now: key -> (the executor's handle, the deadline, the attempt id)."""


def _drive(store: BatchStore, bid: str, out: Path, home: Path, opts: BatchOptions) -> BatchResult:
    if opts.retry_failed and (n := store.requeue_failed(bid)):
        store.add_event(bid, "batch", {"status": "retrying", "ports": n})
    todo = [p for p in store.ports(bid) if p.status not in FINISHED]
    skipped = [p.key for p in store.ports(bid) if p.status in FINISHED]
    bdir = batch_dir(bid)
    executor: Executor | None = None
    if todo:
        cpus = max(PortSpec.model_validate(p.spec).settings.num_cpus for p in todo)
        executor = make_executor(opts, cpus, bdir / "jobs")
    store.set_batch(bid, "running")
    store.add_event(bid, "batch", {"status": "running", "executor": executor.name if executor else "-",
                                   "todo": [p.key for p in todo]})
    t0 = time.time()
    inflight: Inflight = {}
    try:
        if executor is not None:
            ex = executor

            def start(p: PortRow) -> None:
                _start(ex, store, bid, p, out, bdir, home, inflight)

            _run_ports(ex, store, bid, todo, inflight, opts, start, t0)
    finally:
        if executor is not None:
            for h, _, _ in inflight.values():  # interrupted (Ctrl-C): stop what runs; resume continues it
                executor.cancel(h)
            executor.shutdown()
    return _finish(store, bid, out, home, opts, executor, t0, skipped)


def _run_ports(executor: Executor, store: BatchStore, bid: str, todo: list[PortRow], inflight: Inflight,
               opts: BatchOptions, start: Callable[[PortRow], None], t0: float) -> None:
    """Start the ports as the executor has room, reap those that ended, kill those past their timeout, until
    none is left (a cancel fails those not started and stops those running)."""
    _adopt(executor, store, bid, todo, inflight)
    queue = [p for p in todo if p.key not in inflight]
    cancelled = False
    while queue or inflight:
        if not cancelled and opts.should_stop is not None and opts.should_stop():
            _cancel(executor, store, bid, queue, inflight)
            queue, cancelled = [], True
        while queue and len(inflight) < executor.capacity:
            start(queue.pop(0))
        _reap(executor, store, bid, inflight, opts.poll_s)
        _kill_overdue(executor, store, bid, inflight)
        if opts.on_update:
            opts.on_update(BatchView(bid, store.ports(bid), t0, executor.capacity, executor.name))


def _reap(executor: Executor, store: BatchStore, bid: str, inflight: Inflight, poll_s: float) -> None:
    """The ports whose task ended: the task records its own result; this covers one that died before it could."""
    handles = {id(h): k for k, (h, _, _) in inflight.items()}
    for h in executor.done([v[0] for v in inflight.values()], poll_s):
        key = handles[id(h)]
        _, _, attempt = inflight.pop(key)
        why = executor.error(h)
        if store.complete(attempt, "failed", f"the port's task died: {why or 'no result recorded'}",
                          {"model": key, "verdict": "failed"}):
            store.add_event(bid, "port", {"model": key, "status": "failed", "reason": why or "died"})


def _kill_overdue(executor: Executor, store: BatchStore, bid: str, inflight: Inflight) -> None:
    """Ports past their timeout: killed (their sandbox runs too), failed with the reason."""
    now = time.time()
    for key, (h, deadline, attempt) in list(inflight.items()):
        if now <= deadline:
            continue
        att = next((a for a in store.attempts(bid, key) if a["id"] == attempt), {})
        if executor.local and worker_alive(att.get("pid"), attempt, any_cmd=True):
            kill_tree(att.get("pid"))  # the port's sandbox runs too, not only its worker
        executor.cancel(h)
        inflight.pop(key)
        row = store.port(bid, key)
        limit = PortSpec.model_validate(row.spec).settings.timeout_s if row is not None else 0.0
        reason = f"timed out after {limit:.0f} s (the batch killed it)"
        if store.complete(attempt, "failed", reason, {"model": key, "verdict": "failed", "reason": reason}):
            store.add_event(bid, "port", {"model": key, "status": "failed", "reason": reason})


def _finish(store: BatchStore, bid: str, out: Path, home: Path, opts: BatchOptions, executor: Executor | None,
            t0: float, skipped: list[str]) -> BatchResult:
    """The results files and the batch's end status (done, interrupted or cancelled)."""
    ports = store.ports(bid)
    batch = store.batch(bid)
    assert batch is not None
    files = write_results(batch, ports, home, out)
    status = "done" if all(p.status in FINISHED for p in ports) else "interrupted"
    if opts.should_stop is not None and opts.should_stop():
        status = "cancelled"
    store.set_batch(bid, status)
    store.add_event(bid, "batch", {"status": status, "validated": sum(p.status == "validated" for p in ports),
                                   "failed": sum(p.status == "failed" for p in ports), "results": str(files["json"])})
    if opts.on_update:
        opts.on_update(BatchView(bid, ports, t0, executor.capacity if executor else 1,
                                 executor.name if executor else "-"))
    return BatchResult(bid, out, ports, files, executor.name if executor else "-", skipped)


def _cancel(executor: Executor, store: BatchStore, bid: str, queue: list[PortRow],
            inflight: Inflight) -> None:
    """The batch was cancelled: the ports not started fail with the reason; those running are stopped (their
    sandbox runs killed) and record their own end."""
    reason = "cancelled (the batch was cancelled)"
    for p in queue:
        if store.cancel_queued(bid, p.key, reason):
            store.add_event(bid, "port", {"model": p.key, "status": "failed", "reason": reason})
    for h, _, _ in inflight.values():
        executor.cancel(h)
    store.add_event(bid, "batch", {"status": "cancelling"})


def _adopt(executor: Executor, store: BatchStore, bid: str, todo: list[PortRow],
           inflight: Inflight) -> None:
    """Local workers of a driver that died keep running and record their results: wait for them
    rather than run the port a second time."""
    if not isinstance(executor, LocalExecutor):
        return
    for p in todo:
        if p.status != "running" or not p.attempt_id:
            continue
        att = next((a for a in store.attempts(bid, p.key) if a["id"] == p.attempt_id), None)
        if att and worker_alive(att.get("pid"), p.attempt_id):
            timeout = PortSpec.model_validate(p.spec).settings.timeout_s
            deadline = (p.claimed or time.time()) + timeout
            inflight[p.key] = (executor.adopt(p.key, int(att["pid"])), deadline, p.attempt_id)
            store.add_event(bid, "port", {"model": p.key, "status": "running", "adopted": True})


def _start(executor: Executor, store: BatchStore, bid: str, p: PortRow, out: Path, bdir: Path, home: Path,
           inflight: Inflight) -> None:
    claim = store.claim(bid, p.key)
    if claim is None:
        return
    spec = PortSpec.model_validate(p.spec)
    job = {"home": str(home), "batch_id": bid, "key": p.key, "attempt_id": claim.attempt_id,
           "thread_id": claim.thread_id, "resumed": claim.resumed, "spec": spec.model_dump(mode="json"),
           "bundle_dir": str(out / p.key), "batch_dir": str(bdir)}
    store.add_event(bid, "port", {"model": p.key, "status": "queued", "attempt": claim.attempt_id,
                                  "resumed": claim.resumed})
    try:
        handle = executor.submit(job)
    except Exception as exc:
        reason = f"could not start the port: {type(exc).__name__}: {first_line(exc)}"
        store.complete(claim.attempt_id, "failed", reason, {"model": p.key, "verdict": "failed", "reason": reason})
        return
    inflight[p.key] = (handle, time.time() + spec.settings.timeout_s, claim.attempt_id)


__all__ = ["BatchBusy", "BatchOptions", "BatchResult", "BatchView", "ExecutorError", "run_batch", "register"]
