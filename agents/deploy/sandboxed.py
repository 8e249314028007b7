"""The deployment check's two sandboxed sides (sandbox/serving/reference.py, sandbox/serving/client.py), run with
their specs beside them in the check's run folder, and their progress watched while they run."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from contextvars import copy_context
from pathlib import Path
from typing import Any

from knowledge.errors import NpuportError
from sandbox.isolation.process import Limits, Mounts, default_sandbox, scrub, scrubbed_env
from sandbox.isolation.rundir import read_bounded, write_own

# The spec files of the two sides, by the names the engine tuner reads them back under.
SPEC_NAMES = {"sandbox.serving.client": "serve_client", "sandbox.serving.reference": "serve_ref"}
HEARTBEAT_S = 20.0  # a running step is announced again this often (a pipe sees a line at least every 30 s)

Phase = Callable[[str], None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sandboxed(module: str, python: str, spec: dict[str, Any], run_dir: Path, ro: list[Path], wall_s: float,
               env: dict[str, str] | None = None, watch: Phase | None = None) -> dict[str, Any]:
    """One sandboxed side of the check; ``watch`` gets the steps it writes to its progress file (and the
    running step again every HEARTBEAT_S)."""
    name = SPEC_NAMES.get(module, module.rsplit(".", 1)[-1])
    progress = run_dir / f"{name}.progress"
    if watch is not None:
        write_own(progress, "")  # afresh: an earlier check's last step is not this one's
        spec = {**spec, "progress_path": str(progress.resolve())}
    write_own(run_dir / f"{name}.spec.json", json.dumps(spec, indent=1))  # the run folder is the runs' too
    argv = [python, "-I", "-B", "-u", "-m", module, str(run_dir / f"{name}.spec.json")]
    # vLLM maps its KV cache, shared memory and many threads: a larger address space than a harness run.
    limits = Limits(wall_s=wall_s, address_space_mb=64 * 1024, max_procs=1024)
    with _watching(progress, watch):
        res = default_sandbox().execute(argv, cwd=run_dir, env=scrubbed_env(env), limits=limits,
                                        mounts=Mounts(ro=tuple(p.resolve() for p in ro), rw=(run_dir.resolve(),)),
                                        result_channel=True, channel_cap=64 * 2**20)
    write_own(run_dir / f"{name}.stderr.log", scrub(res.stderr)[-200_000:])
    try:
        out = json.loads(res.channel) if res.channel else {}
    except ValueError:
        out = {}
    if not out:
        tail = "\n".join(scrub(res.stderr).strip().splitlines()[-12:])
        out = no_result(module, res.status, res.returncode, wall_s, last_step(progress) if watch else "", tail)
    out["isolation"] = res.isolation
    return dict(out)


def no_result(module: str, status: str, returncode: int | None, wall_s: float, step: str, tail: str) -> dict[str, Any]:
    """The failure of a side that returned no result. A timeout names the step it was stopped in first: the
    stderr tail after it is often a library's warning, which read as the cause (DeepSeek-OCR-2's reference was
    "stopped: The attention mask and the pad token id were not set")."""
    if status == "timeout":
        where = f" in its step \"{step}\"" if step else ""
        return {"ok": False, "timed_out": True,
                "error": f"{module} ran past its time limit ({wall_s:.0f} s) and was stopped{where}; its last output: "
                         f"{tail}"}
    return {"ok": False, "error": f"{module} ended ({status}, code {returncode}) without a result: {tail}"}


def last_step(progress: Path) -> str:
    """The last step a side wrote to its progress file ("" when none): a bounded regular file, never a link;
    the sandboxed code writes it, so it is cut to 200 characters and scrubbed as its stderr is."""
    try:
        lines = read_bounded(progress, 64 * 1024).decode(errors="replace").strip().splitlines()
    except (OSError, NpuportError):
        return ""
    return scrub(lines[-1][:200]) if lines else ""


class _watching:
    """While a sandboxed side runs: its progress file's last line (written by the run: read as a bounded regular
    file, never through a link) goes to ``watch`` when it changes, and again every HEARTBEAT_S with the time."""

    def __init__(self, progress: Path, watch: Phase | None) -> None:
        self.progress, self.watch = progress, watch
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> _watching:
        if self.watch is not None:
            ctx = copy_context()  # LangGraph's stream writer lives in the node's context
            self.thread = threading.Thread(target=ctx.run, args=(self._loop,), daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def _loop(self) -> None:
        assert self.watch is not None
        last, since, t0 = "", time.monotonic(), time.monotonic()
        while not self.done.wait(1.0):
            now = last_step(self.progress) or last
            if now and (now != last or time.monotonic() - since >= HEARTBEAT_S):
                self.watch(now if now != last else f"{now} ({time.monotonic() - t0:.0f} s)")
                last, since = now, time.monotonic()
