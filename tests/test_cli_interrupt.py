"""The one interrupt path (issue 27): a real SIGINT during a tuning trial stops the port within
seconds, kills the trial's sandbox, keeps the checkpoint, exits 130 and prints the command that
resumes it; that command finishes the port. A second press exits at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.tiny_models import write_tiny_model

NPUPORT = [sys.executable, "-m", "api.cli"]


def _start(args: list[str], home: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, NPUPORT_HOME=str(home), COLUMNS="200")
    return subprocess.Popen([*NPUPORT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO_ROOT)


def _wait_for(proc: subprocess.Popen[str], needle: str, timeout: float) -> list[str]:
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    proc.kill()
    pytest.fail(f"never saw {needle!r}: {''.join(seen)}")


@pytest.mark.slow
def test_first_ctrl_c_stops_a_tuning_port_and_resume_finishes_it(tmp_path: Path, npuport_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    out = tmp_path / "out"
    proc = _start(["port", str(model), "--target", "cpu", "--tune", "--tune-trials", "6", "--out", str(out)],
                  npuport_home)
    head = _wait_for(proc, "trial 1/6", timeout=240)  # the second trial's sandbox starts now
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout_rest, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    output = "".join(head) + stdout_rest
    assert proc.returncode == 130, output + stderr
    assert took < 10, f"the first Ctrl-C took {took:.1f}s to stop the port"
    assert "trial 6/6" not in output, "tuning went on after the interrupt"
    assert "Traceback" not in stderr and "cannot schedule new futures" not in stderr, stderr
    thread = output.split("(thread ", 1)[1].split(")", 1)[0]
    assert f"npuport resume {thread}" in " ".join(stderr.split()), stderr
    assert not out.exists() or not (out / "report.json").exists(), "an interrupted port writes no bundle"
    # no sandbox survives the interrupt: no process of the run is left in its session
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(npuport_home / "workspaces") not in ps, ps

    resumed = subprocess.run([*NPUPORT, "resume", thread], capture_output=True, text=True, timeout=400,
                             env=dict(os.environ, NPUPORT_HOME=str(npuport_home), COLUMNS="200"), cwd=REPO_ROOT)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "tuner" in resumed.stdout and "reporter" in resumed.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "validated" and report["tuning"].get("best")
    again = subprocess.run([*NPUPORT, "resume", thread], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, NPUPORT_HOME=str(npuport_home), COLUMNS="200"), cwd=REPO_ROOT)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stdout + again.stderr


@pytest.mark.slow
def test_second_ctrl_c_exits_at_once(tmp_path: Path, npuport_home: Path) -> None:
    model = write_tiny_model(tmp_path / "m")
    proc = _start(["port", str(model), "--target", "cpu", "--tune", "--tune-trials", "6", "--out",
                   str(tmp_path / "out")], npuport_home)
    _wait_for(proc, "validator", timeout=240)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert time.monotonic() - sent < 5
    assert "npuport resume" in stderr


def test_resume_of_an_unknown_thread_is_refused(npuport_home: Path) -> None:
    from typer.testing import CliRunner

    from api.cli import app

    r = CliRunner().invoke(app, ["resume", "nope-123"])
    assert r.exit_code == 2 and "no checkpoint" in r.output
