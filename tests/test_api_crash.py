"""Crash safety: SIGKILL the server mid-port, restart it, and the job resumes from its last
checkpoint with every completed step shown exactly once and a valid bundle at the end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_api_helpers import FAKE_NODES, free_port, sse_events, start_server, wait_http

REPO = Path(__file__).resolve().parents[1]
H = {"Authorization": "Bearer tok"}


def _env(home: Path, root: Path, **extra: str) -> dict[str, str]:
    return {"NPUPORT_HOME": str(home), "NPUPORT_TOKENS": '{"tok": ["read", "write"]}',
            "NPUPORT_ALLOWED_ROOTS": str(root), "NPUPORT_WORKERS": "1", **extra}


def _steps_before_kill(base: str, job_id: str, at_least: int) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    with httpx.Client(base_url=base) as c:
        for ev in sse_events(c, f"/v1/ports/{job_id}/events", H, limit_s=300):
            if ev.get("event") == "step":
                seen.append(json.loads(ev["data"])["data"])
                if len(seen) >= at_least:
                    return seen
            if ev.get("event") == "end":
                raise AssertionError("the job ended before the kill")
    raise AssertionError("the event stream closed early")


def _wait_done(base: str, job_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.time() + timeout
    job: dict[str, Any] = {}
    while time.time() < deadline:
        job = httpx.get(f"{base}/v1/ports/{job_id}", headers=H, timeout=10).json()
        if job["status"] in ("validated", "failed", "cancelled"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job not done in {timeout} s: {job}")


def _all_steps(base: str, job_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    events = httpx.get(f"{base}/v1/ports/{job_id}/events?stream=false", headers=H, timeout=10).json()
    return [e["data"] for e in events if e["kind"] == "step"], events


def _check_no_loss_no_repeat(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    key = [(s["step"], s["agent"], s["summary"], s["t"]) for s in after]
    assert [s["step"] for s in after] == list(range(len(after)))  # contiguous, no duplicate index
    assert len(set(key)) == len(key)
    # every step seen before the crash is still there, unchanged (same time stamp: not re-run)
    assert key[: len(before)] == [(s["step"], s["agent"], s["summary"], s["t"]) for s in before]


def test_sigkill_mid_job_resumes_without_loss_or_repeat_fake_graph(tmp_path: Path) -> None:
    """The bookkeeping, fast, with the stand-in graph (each node logs every execution)."""
    home, root = tmp_path / "home", tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    home.mkdir()
    env = _env(home, root, NPUPORT_FAKE_STEP_S="0.7")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(port, env, fake=True, log=tmp_path / "server.log")
    try:
        job = httpx.post(f"{base}/v1/ports", headers=H, json={"request": {"model_path": "m1", "target": "cpu"}}).json()
        before = _steps_before_kill(base, job["id"], at_least=2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc = start_server(port, {**env, "NPUPORT_FAKE_STEP_S": "0.05"}, fake=True, log=tmp_path / "server.log")
        done = _wait_done(base, job["id"], 60)
        assert done["status"] == "validated"
        after, events = _all_steps(base, job["id"])
        assert [s["agent"] for s in after] == list(FAKE_NODES)
        _check_no_loss_no_repeat(before, after)
        assert any(e["kind"] == "status" and "resum" in e["data"].get("reason", "") for e in events)
        runs = (home / "fake-executions.log").read_text().split()
        # completed nodes never ran again; only the one interrupted by the kill may have run twice
        assert sorted(set(runs)) == sorted(FAKE_NODES) and len(runs) - len(FAKE_NODES) <= 1
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
def test_sigkill_mid_real_port_resumes_from_checkpoint(tmp_path: Path) -> None:
    """A real port of examples/ocr_mini on the cpu target, served by `python -m api.serve`."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, **_env(home, REPO / "examples")}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "ab")  # noqa: SIM115
    cmd = [sys.executable, "-m", "api.serve", "--port", str(port), "--log-level", "warning"]
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_http(f"{base}/healthz", proc=first)
        r = httpx.post(f"{base}/v1/ports", headers=H, json={"request": {"model_path": "ocr_mini", "target": "cpu"}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        before = _steps_before_kill(base, job_id, at_least=1)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{base}/healthz", proc=second)
        done = _wait_done(base, job_id, 500)
        assert done["status"] == "validated", (done, (tmp_path / "server.log").read_text()[-3000:])
        after, events = _all_steps(base, job_id)
        _check_no_loss_no_repeat(before, after)
        assert any(e["kind"] == "status" and "resum" in e["data"].get("reason", "") for e in events)
        assert [s["agent"] for s in after].count("planner") == 1
        bundle = Path(done["request"]["out_dir"])
        report = json.loads((bundle / "report.json").read_text())
        assert report["status"] == "validated"
        assert (bundle / "port.patch").read_text().strip()
        trace = [json.loads(line) for line in (bundle / "trace.jsonl").read_text().splitlines() if line.strip()]
        # the bundle's trace and the events are the same steps, in the same order
        assert [(t["agent"], t["summary"], t["t"]) for t in trace] == \
            [(s["agent"], s["summary"], s["t"]) for s in after[: len(trace)]]
        assert len(after) - len(trace) <= 1  # the reporter's own closing step comes after trace.jsonl
    finally:
        for p in (first, second):
            if p is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)  # the server and any sandbox child it left
                p.wait(10)
        log.close()
