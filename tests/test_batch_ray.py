"""Batch mode on Ray, end to end through `npuport batch` with real ports (cpu target, tiny models):
embedded local Ray, a real local cluster started with `ray start --head`, and kill -9 of the driver
followed by a resume in which every port runs exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batch_models import write_zoo
from tests.conftest import REPO_ROOT

pytest.importorskip("ray", reason="the batch extra is not installed: pip install 'npuport[batch]'")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_ray_at_a_time")]

RAY = str(Path(sys.executable).parent / "ray")


def _env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, NPUPORT_HOME=str(home), COLUMNS="200", **(extra or {}))
    env.pop("RAY_ADDRESS", None)
    return env


def batch(*args: str, home: Path, timeout: float = 420, extra_env: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "api.cli", "batch", *args], capture_output=True, text=True,
                          env=_env(home, extra_env), cwd=REPO_ROOT, timeout=timeout)


def _rows(out: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {r["model"]: r for r in json.loads((out / "results.json").read_text())["ports"]}


def _db(home: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(home / "batches.sqlite"), timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def _check_zoo(out: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    rows = _rows(out)
    assert rows["alpha"]["verdict"] == "validated" and rows["beta"]["verdict"] == "validated", rows
    assert rows["gamma"]["verdict"] == "failed" and "an op no recipe covers" in rows["gamma"]["reason"]
    for key in ("alpha", "beta", "gamma"):
        assert (out / key / "report.json").is_file() and rows[key]["bundle"] == str(out / key)
        assert rows[key]["sandbox_runs"] >= 1 and rows[key]["hazards_found"] >= 1
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("model,target,verdict,sandbox_runs") and len(csv_lines) == 4
    md = (out / "report.md").read_text()
    assert "2 of 3 ports validated" in md and "| gamma | cpu | failed |" in md
    return rows


def test_embedded_ray_batch_resume_and_retry(tmp_path: Path, npuport_home: Path) -> None:
    manifest = write_zoo(tmp_path)
    out = tmp_path / "out"
    r = batch(str(manifest), "--out", str(out), home=npuport_home)
    assert r.returncode == 1, r.stdout + r.stderr  # one port failed
    _check_zoo(out)
    # each port is a Ray task in its own worker (the attempt records the worker's pid)
    with _db(npuport_home) as db:
        pids = {row["key"]: row["pid"] for row in db.execute("SELECT key, pid FROM attempts")}
    assert len(set(pids.values())) >= 1 and all(pids.values()) and os.getpid() not in pids.values()
    # the same manifest again: finished ports are skipped, the failed one too (no --retry-failed)
    t0 = time.monotonic()
    r2 = batch(str(manifest), home=npuport_home)
    assert r2.returncode == 1 and time.monotonic() - t0 < 60
    assert "skipped 3 port(s) an earlier run of this batch finished" in r2.stdout, r2.stdout
    with _db(npuport_home) as db:
        assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 3
    # --retry-failed runs only the failed port again, on a fresh thread
    r3 = batch(str(manifest), "--retry-failed", home=npuport_home)
    assert r3.returncode == 1, r3.stdout + r3.stderr
    with _db(npuport_home) as db:
        per = dict(db.execute("SELECT key, COUNT(*) FROM attempts GROUP BY key").fetchall())
        threads = {row[0] for row in db.execute("SELECT thread_id FROM attempts WHERE key='gamma'")}
    assert per == {"alpha": 1, "beta": 1, "gamma": 2} and len(threads) == 2
    # the retry's bundle replaced the failed attempt's in the batch's own folder (not redirected)
    rows = {row["model"]: row for row in json.loads((out / "results.json").read_text())["ports"]}
    assert Path(rows["gamma"]["bundle"]).resolve() == (out / "gamma").resolve(), rows["gamma"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def ray_cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A real local cluster with Ray's token authentication (its default since 2.5x); the driver
    gets the same token through the environment, as a user's shell would."""
    port = _free_port()
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex}
    env = dict(os.environ, **auth)
    env.pop("RAY_ADDRESS", None)
    start = subprocess.run([RAY, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                            "--disable-usage-stats"], capture_output=True, text=True, env=env, timeout=180)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield f"127.0.0.1:{port}", auth
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env, timeout=120)


def test_batch_on_a_ray_cluster_by_address(tmp_path: Path, npuport_home: Path,
                                           ray_cluster: tuple[str, dict[str, str]]) -> None:
    manifest = write_zoo(tmp_path)
    out = tmp_path / "out"
    address, auth = ray_cluster
    r = batch(str(manifest), "--ray-address", address, "--out", str(out), home=npuport_home, extra_env=auth)
    assert r.returncode == 1, r.stdout + r.stderr
    _check_zoo(out)
    with _db(npuport_home) as db:
        events = [json.loads(row[0]) for row in db.execute("SELECT data FROM events WHERE kind='batch'")]
    assert events[0]["executor"] == "ray"


def test_kill_9_of_the_driver_then_resume_runs_each_port_once(tmp_path: Path, npuport_home: Path) -> None:
    manifest = write_zoo(tmp_path)
    out = tmp_path / "out"
    # one port at a time, so that when the first result is in, the second is running
    driver = subprocess.Popen([sys.executable, "-m", "api.cli", "batch", str(manifest), "--workers", "1",
                               "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=_env(npuport_home), cwd=REPO_ROOT, start_new_session=True)
    first: tuple[str, float] | None = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and first is None:
            time.sleep(0.3)
            try:
                with _db(npuport_home) as db:
                    row = db.execute("SELECT key, finished FROM ports WHERE finished IS NOT NULL").fetchone()
                    busy = db.execute("SELECT key FROM ports WHERE status='running' AND started IS NOT NULL").fetchone()
            except sqlite3.OperationalError:  # the driver has not created the tables yet
                continue
            # kill while one result is in and the next port is running in its task
            first = (row["key"], row["finished"]) if row and busy else None
        assert first is not None, "no port finished"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        # what the dead driver's embedded Ray left behind (its agents) goes too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    with _db(npuport_home) as db:
        interrupted = [r["key"] for r in db.execute("SELECT key FROM ports WHERE status='running'")]
    assert len(interrupted) == 1
    r = batch(str(manifest), "--workers", "1", home=npuport_home)
    assert r.returncode == 1, r.stdout + r.stderr
    _check_zoo(out)
    with _db(npuport_home) as db:
        ports = {row["key"]: dict(row) for row in db.execute("SELECT * FROM ports")}
        outcomes = db.execute("SELECT key, outcome, thread_id FROM attempts").fetchall()
        steps = [json.loads(row[0]) for row in db.execute("SELECT data FROM events WHERE kind='step'")]
    # the finished result was neither lost nor written again
    assert ports[first[0]]["finished"] == first[1] and ports[first[0]]["attempts"] == 1
    # exactly one recorded result per port
    done = [o["key"] for o in outcomes if o["outcome"]]
    assert sorted(done) == ["alpha", "beta", "gamma"]
    # a port interrupted mid-run continued its own thread from its last checkpoint: no agent step ran twice
    for key in interrupted:
        assert ports[key]["attempts"] == 2
        assert len({o["thread_id"] for o in outcomes if o["key"] == key}) == 1
    for key in ("alpha", "beta", "gamma"):
        agents = [s["agent"] for s in steps if s["model"] == key]
        assert agents.count("planner") == 1 and agents.count("reporter") == 1, (key, agents)


def test_a_hanging_port_is_cancelled_on_ray_and_the_others_validate(tmp_path: Path, npuport_home: Path) -> None:
    from tests.test_batch import _processes_in

    manifest = write_zoo(tmp_path, hang=True)
    out = tmp_path / "out"
    r = batch(str(manifest), "--workers", "2", "--out", str(out), home=npuport_home,
              extra_env={"NPUPORT_SANDBOX": "process"})  # bwrap would end the run with its worker by itself
    assert r.returncode == 1, r.stdout + r.stderr
    rows = _rows(out)
    assert rows["alpha"]["verdict"] == rows["beta"]["verdict"] == "validated"
    assert rows["gamma"]["verdict"] == "failed" and "timed out after 12 s" in rows["gamma"]["reason"]
    assert not _processes_in(npuport_home)
