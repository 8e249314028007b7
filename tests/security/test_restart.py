"""Class: restart safety. A server killed with SIGKILL leaves no sandboxed run behind: its direct child
dies with it (PDEATHSIG / bwrap --die-with-parent) and what escaped into a session of its own is reaped
when the next server starts (reap_orphans, called by JobManager.start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.isolation.reaper import reap_orphans

SERVER = '''
import sys
from pathlib import Path
from sandbox.isolation.process import BubblewrapSandbox, Limits, ProcessSandbox, bwrap_available, scrubbed_env
box = BubblewrapSandbox(bwrap_available()) if sys.argv[1] == "bwrap" else ProcessSandbox()
work = Path(sys.argv[2])
cmd = ["sh", "-c", "setsid sh -c 'echo $$ > daemon.pid; exec sleep 120' & echo $$ > child.pid; sleep 120"]
box.execute(cmd, cwd=work, env=scrubbed_env(), limits=Limits(wall_s=300))
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cwd(pid: str) -> str | None:
    """A process's working folder; None when it is gone or another user's (a run of the server this test
    started is its own user's: another user's `sleep 120`, a concurrent CI's say, cannot be one)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


@pytest.mark.parametrize("mode", ["bwrap", "process"])
def test_sigkilled_server_leaves_no_run_behind(mode: str, tmp_path: Path, npuport_home: Path) -> None:
    from sandbox.isolation.process import bwrap_available

    if mode == "bwrap" and bwrap_available() is None:
        pytest.skip("bubblewrap is not installed here")
    work = tmp_path / "work"
    work.mkdir()
    server = subprocess.Popen([sys.executable, "-c", SERVER, mode, str(work)], env={**os.environ})
    deadline = time.time() + 20
    while time.time() < deadline and not (work / "daemon.pid").exists():
        time.sleep(0.1)
    assert (work / "daemon.pid").exists(), "the run never started"
    # no pause: a server killed just after starting the run (before it knew the pid) leaves nothing either
    server.send_signal(signal.SIGKILL)
    server.wait()
    reap_orphans()  # what the next server does on start
    time.sleep(0.5)
    if mode == "process":  # pids in the host namespace (under bwrap they are the sandbox's own)
        for name in ("child.pid", "daemon.pid"):
            pid = int((work / name).read_text())
            assert not _alive(pid), f"{name} ({pid}) outlived its killed server"
    out = subprocess.run(["pgrep", "-f", "exec sleep 120|sleep 120"], capture_output=True, text=True).stdout.split()
    mine = [p for p in out if _cwd(p) == str(work.resolve())]
    assert not mine, f"processes of the killed server's run remain: {mine}"


def test_a_job_running_at_two_service_deaths_is_quarantined(npuport_home: Path, tmp_path: Path) -> None:
    """A job whose model kills the service (a parser crash, a memory bomb) would kill it again on every
    resume: resumed once after a death, it is quarantined (failed, not resumed) after the second. A
    clean stop between is not a death."""
    from test_api import make_settings
    from test_api_helpers import fake_builder

    from api.jobs import QUARANTINED, JobManager, JobStore, make_job

    roots = tmp_path / "models"
    (roots / "m1").mkdir(parents=True)
    settings = make_settings(npuport_home, roots)
    home = settings.resolved_home()
    home.mkdir(parents=True, exist_ok=True)

    def die_while_running(job_id: str) -> None:  # what a SIGKILL mid-run leaves: the record says running
        store = JobStore(home / "jobs.sqlite")
        store.update(job_id, status="running", started=0)
        store.close()

    store = JobStore(home / "jobs.sqlite")
    job = make_job(goal="", request={"model_path": str(roots / "m1"), "target": "cpu"}, owner="tok", home=home)
    store.create(job, None)
    store.update(job.id, status="running")
    store.close()

    def restart() -> str:
        store = JobStore(home / "jobs.sqlite")
        mgr = JobManager(settings, store, builder=fake_builder)
        mgr.start()
        deadline = time.time() + 30
        status = store.get(job.id).status  # type: ignore[union-attr]
        while time.time() < deadline and status not in ("failed", "validated", "cancelled"):
            time.sleep(0.05)
            status = store.get(job.id).status  # type: ignore[union-attr]
        reason = store.get(job.id).reason  # type: ignore[union-attr]
        mgr.stop()
        (home / "service-stopped-cleanly").unlink(missing_ok=True)  # the next start follows a death
        store.close()
        return f"{status}: {reason}"

    first = restart()  # first death: resumed (the fake graph then validates it)
    assert first.startswith("validated"), first
    die_while_running(job.id)
    second = restart()  # it was running at a death again, after a crash resume: quarantined
    assert second == f"failed: {QUARANTINED}", second
