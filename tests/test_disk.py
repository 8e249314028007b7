"""A full disk is named as such (knowledge/disk.py): torch.save's zip writer reports a short write as
"unexpected pos A vs B", which reads like a bug in the model; a run that failed so on a nearly full disk
says why, and the CLI warns before a port starts. Real writes to /dev/full; the threshold is moved, not
the disk's figures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from knowledge import disk

DEV_FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not DEV_FULL.exists(), reason="no /dev/full on this host")


def _short_write_message() -> str:
    with pytest.raises(RuntimeError) as caught:
        torch.save({"w": torch.zeros(4096)}, str(DEV_FULL))
    return str(caught.value)


@needs_dev_full
def test_torch_saves_short_write_on_a_nearly_full_disk_is_explained(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    message = _short_write_message()
    assert "unexpected pos" in message  # what CI saw, and what the harness records
    monkeypatch.setattr(disk, "LOW_FREE_BYTES", shutil.disk_usage(tmp_path).free + 2**30)  # "nearly full"
    why = disk.explain_write_failure(message, tmp_path / "run-1")  # a folder not made yet: its parent's disk
    assert why is not None and "lack of disk space" in why and str(tmp_path / "run-1") in why and "MiB free" in why


@needs_dev_full
def test_a_short_write_with_room_on_the_disk_or_another_error_is_left_alone(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk, "LOW_FREE_BYTES", 0)
    assert disk.explain_write_failure(_short_write_message(), tmp_path) is None
    monkeypatch.setattr(disk, "LOW_FREE_BYTES", shutil.disk_usage(tmp_path).free + 2**30)
    assert disk.explain_write_failure("RuntimeError: shape '[2, 3]' is invalid for input of size 7", tmp_path) is None
    with pytest.raises(OSError) as caught, DEV_FULL.open("wb") as f:  # Python's own words for it
        f.write(b"x" * 65536)
        f.flush()
    assert disk.explain_write_failure(str(caught.value), tmp_path) is not None


def test_the_cli_warns_before_a_port_on_a_nearly_full_disk(npuport_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from api.cli_port import disk_warning

    monkeypatch.setattr(disk, "LOW_FREE_BYTES", 0)
    disk_warning()
    assert "free" not in capsys.readouterr().err
    monkeypatch.setattr(disk, "LOW_FREE_BYTES", shutil.disk_usage(npuport_home).free + 2**30)
    disk_warning()
    said = " ".join(capsys.readouterr().err.split())
    assert "warning:" in said and "MiB free" in said and "NPUPORT_HOME" in said


@needs_dev_full
def test_a_runs_recorded_exception_carries_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.runs import _exception

    monkeypatch.setattr(disk, "LOW_FREE_BYTES", shutil.disk_usage(tmp_path).free + 2**30)
    long_message = "x" * 300 + " " + _short_write_message()  # long, as a real message can be
    exc = _exception({"exception": {"type": "RuntimeError", "message": long_message}}, tmp_path)
    assert exc is not None and exc.message.startswith(long_message) and "[npuport: a write failed" in exc.message
