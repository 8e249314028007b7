"""Class: the run folder is hostile data. The model's code owns its run folder while it runs; what it
leaves there (links to files of its choosing, FIFOs, a forged bench result, a capture that inflates)
must not make npuport, outside the sandbox, write elsewhere, block, trust it, or load it unbounded."""

from __future__ import annotations

import json
import os
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from agents.workspace import Workspace
from sandbox.bench.runner import run_bench
from sandbox.harness.runner import run_harness
from sandbox.isolation.process import Limits, Sandbox
from sandbox.targets import Target

from .conftest import write_model

PARENT_FILES = ("stdout.log", "stderr.log", "result.json", "spec.json")


def _harness(tmp_path: Path, box: Sandbox, at_import: str, in_generate: str = "pass", runs: int = 1,  # type: ignore[no-untyped-def]
             limits: Limits | None = None):
    original = write_model(tmp_path / "user-model", at_import, in_generate)
    ws = Workspace.create(original, tmp_path / "work")
    manifest = yaml.safe_load((ws.model_dir / "npuport.yaml").read_text())
    out = None
    for _ in range(runs):  # the same run folder again: an earlier run's plants meet the next spec write
        out = run_harness(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / "port", manifest=manifest,
                          target=Target("cpu", "cpu"), sandbox=box, limits=limits or Limits(wall_s=60))
    assert out is not None
    return out


def test_planted_links_never_redirect_the_parents_writes(tmp_path: Path, box: Sandbox) -> None:
    """Links named like the parent's files point where the model wants npuport to write (a .pth in a
    shared env, the port memory): the parent replaces the link, never writes through it."""
    victims = {name: tmp_path / f"victim-{name}" for name in PARENT_FILES}
    plant = f'''
for name, target in {{k: str(v) for k, v in {victims!r}.items()}}.items():
    try:
        os.unlink(name)
    except OSError:
        pass
    os.symlink(target, name)
'''.replace("PosixPath", "")
    run = _harness(tmp_path, box, "from pathlib import PosixPath\n" + plant, runs=2)
    for name, victim in victims.items():
        assert not victim.exists(), f"npuport wrote through a planted link {name} -> {victim}"
    for name in ("stdout.log", "stderr.log", "result.json"):
        p = run.run_dir / name
        assert p.is_file() and not p.is_symlink(), name
    assert json.loads((run.run_dir / "result.json").read_text()) == run.result


def test_fifos_in_the_run_folder_do_not_block_the_parent(tmp_path: Path, box: Sandbox) -> None:
    plant = '''
for name in ("stdout.log", "stderr.log", "result.json", "capture.pt"):
    try:
        os.unlink(name)
    except OSError:
        pass
    os.mkfifo(name)
'''
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(_harness(tmp_path, box, plant)), daemon=True)
    t.start()
    t.join(90)
    assert done, "the parent blocked on a FIFO the run left in its folder"
    run = done[0]
    assert (run.run_dir / "result.json").is_file()  # type: ignore[attr-defined]


def test_a_forged_bench_result_file_is_not_read(tmp_path: Path, box: Sandbox) -> None:
    """The tuner's numbers come from the bench's channel, not a file the model can write: a model that
    writes a glowing bench.json and exits before measuring anything gets no numbers."""
    forged = {"ok": True, "configs": [{"config": {"batch": 1}, "status": "ok", "dtype_ok": True,
                                       "points": [{"concurrency": 1, "tokens_per_s": 1e9}]}]}
    at_import = f'''
import json as _json
_json.dump({forged!r}, open("bench.json", "w"))
os._exit(0)
'''
    original = write_model(tmp_path / "user-model", at_import)
    ws = Workspace.create(original, tmp_path / "work")
    manifest = yaml.safe_load((ws.model_dir / "npuport.yaml").read_text())
    run = run_bench(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / "bench", manifest=manifest,
                    configs=[{"batch": 1}], warmup=0, repeats=1, limits=Limits(wall_s=60), sandbox=box)
    assert not run.result.get("ok") and not run.result.get("configs"), run.result


def _bomb(path: Path, inflated_mb: int) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf, \
            zf.open("archive/data/0", "w", force_zip64=True) as fh:
        chunk = b"\0" * (1 << 20)
        for _ in range(inflated_mb):
            fh.write(chunk)


def test_capture_files_are_bounded_before_any_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that inflates past the cap, a FIFO or a link is refused before torch.load sees it."""
    import torch

    from agents.validation import numerics
    loads: list[object] = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    monkeypatch.setattr(numerics, "MAX_CAPTURE_BYTES", 8 << 20)
    ref = tmp_path / "ref.pt"
    torch.save({"__step__": torch.zeros(4)}, ref)
    bomb = tmp_path / "bomb.pt"
    _bomb(bomb, 64)
    assert bomb.stat().st_size < (1 << 20)  # small on disk, 64 MiB once inflated
    fifo = tmp_path / "fifo.pt"
    os.mkfifo(fifo)
    link = tmp_path / "link.pt"
    link.symlink_to(ref)
    for hostile in (bomb, fifo, link):
        with pytest.raises(Exception) as info:
            numerics.compare_captures(hostile, ref, ["__step__"])
        assert type(info.value).__name__ == "HostileRunFile", (hostile.name, info.value)
    assert not loads, "torch.load ran on a capture file before it was bounded"
    assert numerics.compare_captures(ref, ref, ["__step__"])["output_within_tolerance"]


def test_the_run_folder_has_a_quota(tmp_path: Path, box: Sandbox) -> None:
    """RLIMIT_FSIZE caps one file; many files under it would still fill the server's disk."""
    fill = '''
for i in range(64):
    with open(f"fill-{i}", "wb") as fh:
        fh.write(os.urandom(1 << 20))
time.sleep(30)
'''
    t0 = time.monotonic()
    run = _harness(tmp_path, box, fill, limits=Limits(wall_s=60, folder_quota_mb=8))
    assert not run.ok and time.monotonic() - t0 < 25, run.result
    assert any("quota" in n for n in run.exec_result.notes), run.exec_result.notes
