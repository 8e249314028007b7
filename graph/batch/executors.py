"""Where the ports of a batch run: Ray tasks (embedded local Ray, or a cluster by address) or local
worker processes. Either way the port's code is graph.batch.port.execute_port, which records its own
result; an executor only starts, watches and kills."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from knowledge.errors import ExecutorError, first_line
from sandbox.isolation.reaper import pid_alive

INSTALL_HINT = "pip install 'npuport[batch]'"


class Executor(Protocol):
    name: str
    local: bool
    """The ports' processes run on this machine (their pids mean something here)."""
    capacity: int
    """How many ports may run at once."""

    def submit(self, job: dict[str, Any]) -> Any: ...
    def done(self, handles: list[Any], timeout: float) -> list[Any]: ...
    def error(self, handle: Any) -> str | None:
        """None when the task ended normally, else why it did not (crash, killed)."""
        ...
    def cancel(self, handle: Any) -> None: ...
    def shutdown(self) -> None: ...


def _ray_entry(job: dict[str, Any]) -> dict[str, Any]:
    from graph.batch.port import execute_port

    return execute_port(job)


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None, workers: int | None, cpus_per_port: float) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ExecutorError(f"batch mode on Ray needs the `ray` package: {INSTALL_HINT} "
                                "(or run with --executor local)") from exc
        self._ray = ray
        # Ray announces its token-auth default on every embedded start; the batch's own table says enough
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
        address = address or os.environ.get("RAY_ADDRESS") or None
        common: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING,
                                  "ignore_reinit_error": True}
        try:
            if address:
                ray.init(address=address, **common)
            else:
                # address="local": always a fresh embedded instance, never a cluster that `ray start` left
                ray.init(address="local", num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                         object_store_memory=80 * 1024 * 1024, **common)
        except Exception as exc:
            raise ExecutorError(f"cannot start Ray{f' at {address}' if address else ''}: "
                                f"{first_line(exc)}") from exc
        self.address = address or "embedded"
        self.local = not address  # the ports' processes live on this machine
        cpus = float(ray.cluster_resources().get("CPU", 1))
        fit = max(1, int(cpus // cpus_per_port))
        self.capacity = min(fit, workers) if workers else fit
        # no automatic retries: a port runs again only when the batch claims it again (exactly once)
        # max_calls=1: a fresh worker process per port, so no module state (a knowledge-base client that
        # has not seen what earlier ports learned, thread settings) carries over from one port to the next
        self._remote = ray.remote(max_retries=0, max_calls=1)(_ray_entry)

    def submit(self, job: dict[str, Any]) -> Any:
        s = job["spec"]["settings"]
        return self._remote.options(num_cpus=s["num_cpus"], memory=int(s["memory_mb"]) * 1024 * 1024,
                                    name=f"npuport-port-{job['spec']['key']}").remote(job)

    def done(self, handles: list[Any], timeout: float) -> list[Any]:
        if not handles:
            return []
        # back as soon as one port ends (waiting for all, up to the poll time, delayed the next port's start)
        ready, rest = self._ray.wait(handles, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        return list(ready)

    def error(self, handle: Any) -> str | None:
        try:
            self._ray.get(handle, timeout=10)
        except Exception as exc:
            return f"{type(exc).__name__}: {first_line(exc)}"[:300]
        return None

    def cancel(self, handle: Any) -> None:
        with contextlib.suppress(Exception):  # already finished: nothing to kill
            self._ray.cancel(handle, force=True)

    def shutdown(self) -> None:
        self._ray.shutdown()


class ProcHandle:
    def __init__(self, key: str, pid: int, proc: subprocess.Popen[bytes] | None) -> None:
        self.key, self.pid, self.proc = key, pid, proc

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        return None if pid_alive(self.pid) else 0


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc), e.g. the sandbox runs of a port: they sit in
    sessions of their own, so killing the port's worker alone would leave them running."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(pid: int | None) -> None:
    """Kill the port's worker process and everything it started (a local process only)."""
    if not pid:
        return
    below = descendants(pid)
    for p in [pid, *below]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


def worker_alive(pid: int | None, attempt_id: str, any_cmd: bool = False) -> bool:
    """Is ``pid`` still the local worker of this attempt (not a reused pid)? ``any_cmd``: a Ray worker
    too (its command line does not name the attempt)."""
    if not pid or not pid_alive(pid):
        return False
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    if any_cmd and ("ray::" in cmd or "default_worker.py" in cmd):
        return True
    return "graph.batch.port" in cmd and attempt_id in cmd


class LocalExecutor:
    """Ports as `python -m graph.batch.port` processes in sessions of their own: they outlive a killed
    driver and record their results, and a resumed driver waits for them (adopt) instead of re-running."""

    name = "local"
    local = True

    def __init__(self, workers: int | None, jobs_dir: Path) -> None:
        self.capacity = max(1, workers or 2)
        self.jobs_dir = jobs_dir
        jobs_dir.mkdir(parents=True, exist_ok=True)

    def submit(self, job: dict[str, Any]) -> ProcHandle:
        path = self.jobs_dir / f"{job['spec']['key']}.{job['attempt_id']}.json"
        path.write_text(json.dumps(job))
        log = (self.jobs_dir / f"{job['spec']['key']}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "graph.batch.port", str(path)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        return ProcHandle(job["spec"]["key"], proc.pid, proc)

    def adopt(self, key: str, pid: int) -> ProcHandle:
        return ProcHandle(key, pid, None)

    def done(self, handles: list[ProcHandle], timeout: float) -> list[ProcHandle]:
        import time

        end = time.monotonic() + timeout
        while True:
            ready = [h for h in handles if h.poll() is not None]
            if ready or time.monotonic() >= end:
                return ready
            time.sleep(0.1)

    def error(self, handle: ProcHandle) -> str | None:
        rc = handle.poll()
        if rc in (0, None):
            return None
        return f"worker process exited with {'signal ' + str(-rc) if rc < 0 else 'code ' + str(rc)}"

    def cancel(self, handle: ProcHandle) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, signal.SIGKILL)
        if handle.proc is not None:
            handle.proc.wait(timeout=10)

    def shutdown(self) -> None:
        pass


class PoolHandle:
    def __init__(self, key: str, future: Any, stop: Any) -> None:
        self.key, self.future, self.stop = key, future, stop


class PoolExecutor:
    """Ports as tasks of the service's own worker pool (api/jobs.py): the same threads that run its jobs, so a
    batch never runs more sandboxes than the operator's workers, at most ``capacity`` of them at once. ``submit``
    hands a callable to the pool and returns its future; a cancel stops the port's graph and kills its sandbox
    run in flight."""

    name = "pool"
    local = False  # no process of its own to kill: its cancel is its stop flag

    def __init__(self, submit: Any, capacity: int) -> None:
        self._submit = submit
        self.capacity = max(1, capacity)

    def submit(self, job: dict[str, Any]) -> PoolHandle:
        import threading

        from graph.batch.port import execute_port

        stop = threading.Event()
        return PoolHandle(job["spec"]["key"], self._submit(execute_port, job, stop.is_set), stop)

    def done(self, handles: list[PoolHandle], timeout: float) -> list[PoolHandle]:
        from concurrent.futures import FIRST_COMPLETED, wait

        if not handles:
            return []
        wait([h.future for h in handles], timeout=timeout, return_when=FIRST_COMPLETED)
        return [h for h in handles if h.future.done()]

    def error(self, handle: PoolHandle) -> str | None:
        if handle.future.cancelled():
            return "cancelled before it started"
        exc = handle.future.exception()
        return f"{type(exc).__name__}: {first_line(exc)}"[:300] if exc else None

    def cancel(self, handle: PoolHandle) -> None:
        handle.stop.set()
        handle.future.cancel()  # not started yet: it never starts

    def shutdown(self) -> None:
        pass

