"""The process sandbox: timeouts kill the whole group, rlimits apply, secrets never reach the child."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

from sandbox.isolation.process import Limits, ProcessSandbox, scrubbed_env


def test_wall_timeout_kills_the_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-alive"
    # The child starts a grandchild that would write a file after 3 s; the timeout must kill both.
    grandchild = f"import time; time.sleep(3); open({str(marker)!r}, 'w').write('x')"
    code = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {grandchild!r}])\ntime.sleep(60)\n"
    start = time.monotonic()
    res = ProcessSandbox().execute([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_env(),
                                   limits=Limits(wall_s=1.0))
    assert res.status == "timeout"
    assert time.monotonic() - start < 10
    time.sleep(3.5)
    assert not marker.exists(), "the grandchild survived the timeout"


def test_secrets_are_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("NPUPORT_API_TOKEN", "tok")
    monkeypatch.setenv("SOME_RANDOM_VAR", "1")
    code = "import os, json; print(json.dumps(sorted(os.environ)))"
    res = ProcessSandbox().execute([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_env(), limits=Limits())
    assert res.status == "ok"
    assert "OPENAI_API_KEY" not in res.stdout and "NPUPORT_API_TOKEN" not in res.stdout
    assert "SOME_RANDOM_VAR" not in res.stdout


def test_cwd_is_the_workspace_and_errors_are_reported(tmp_path: Path) -> None:
    res = ProcessSandbox().execute([sys.executable, "-c", "import os; print(os.getcwd()); raise SystemExit(3)"],
                                   cwd=tmp_path, env=scrubbed_env(), limits=Limits())
    assert res.status == "error" and res.returncode == 3
    assert res.stdout.strip() == str(tmp_path)


def test_address_space_limit_stops_a_runaway_allocation(tmp_path: Path) -> None:
    code = "x = bytearray(2 * 1024**3)\nprint('allocated')"
    res = ProcessSandbox().execute([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_env(),
                                   limits=Limits(address_space_mb=512))
    assert res.status == "error"
    assert "MemoryError" in res.stderr


def test_file_size_limit(tmp_path: Path) -> None:
    code = f"open({str(tmp_path / 'big')!r}, 'wb').write(b'0' * (4 * 1024 * 1024))"
    res = ProcessSandbox().execute([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_env(),
                                   limits=Limits(file_size_mb=1))
    assert res.status != "ok"
    assert os.path.getsize(tmp_path / "big") <= 1024 * 1024


def test_result_channel_leaves_the_parents_fds_alone(tmp_path: Path) -> None:
    """The result pipe gets whatever fd number the OS gives it. It used to be dup2'd onto a fixed number
    in the parent, which clobbered an fd the server already held there (a file, a socket, a database)."""
    held = tmp_path / "held.txt"
    with open(held, "w") as fh:
        fixed = 201
        saved = None
        with contextlib.suppress(OSError):  # fd 201 may be free here
            saved = os.dup(fixed)
        os.dup2(fh.fileno(), fixed)
        try:
            code = "import os; os.write(int(os.environ['HARNESS_RESULT_FD']), b'result')"
            res = ProcessSandbox().execute([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_env(),
                                           limits=Limits(wall_s=30), result_channel=True, channel_cap=1024)
            assert res.status == "ok" and res.channel == b"result"
            assert os.path.sameopenfile(fixed, fh.fileno())  # still our file, not closed or replaced
        finally:
            if saved is not None:
                os.dup2(saved, fixed)
                os.close(saved)
            else:
                os.close(fixed)
