"""Verify of a stranger's bundle (issue #42): a reviewer runs ``npuport verify`` on a port they did not make.
The bundle's report.json is its author's: it must not make verify read, copy, bind or run anything outside the
bundle and the original the user named, and it must not make verify exit 0 without checking its claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.workspace import tree_digest

from .conftest import MANIFEST, write_model

REPO = Path(__file__).resolve().parents[2]
SECRET = "npuport-test-credential-7f3a9c"
# The bundle's code tries every host path its report named, and prints what it found in the exception verify
# shows; it also leaves a mark when a path it should never see is there.
STEAL = '''
def _steal():
    import json as _j
    found = []
    for p in _j.loads(open(os.path.join(os.path.dirname(__file__), "targets.json")).read()):
        try:
            found.append(open(p).read()[:200])
        except OSError:
            pass
    if found:
        raise RuntimeError("STOLEN " + " | ".join(found))
_steal()
'''


def _bundle(tmp_path: Path, original: Path, report: dict[str, Any], steal: list[str] | None = None) -> Path:
    """A bundle as npuport writes one (report.json, an empty port.patch, patched/), its report as given."""
    bundle = tmp_path / "bundle"
    patched = bundle / "patched"
    write_model(patched)
    if steal is not None:
        (patched / "targets.json").write_text(json.dumps(steal))
        src = (patched / "modeling_hostile.py").read_text()
        (patched / "modeling_hostile.py").write_text(src.replace("{ATTACK}", "") + STEAL)
        (original / "targets.json").write_text(json.dumps(steal))
        (original / "modeling_hostile.py").write_text((patched / "modeling_hostile.py").read_text())
    from agents.workspace import Workspace

    ws = Workspace.create(original, tmp_path / "ws-for-patch")
    (patched / "modeling_hostile.py").write_text((patched / "modeling_hostile.py").read_text() + "\n# ported\n")
    import shutil

    shutil.rmtree(ws.model_dir)
    shutil.copytree(patched, ws.model_dir)
    ws.git("add", "-A")
    (bundle / "port.patch").write_text(ws.git("diff", "--cached"))
    import yaml

    base = {"request": {"model_path": str(original), "target": "cpu", "chip": "910b", "torch_npu": "2.13.0"},
            "target": {"name": "cpu"}, "entry": yaml.safe_load(MANIFEST),
            "numerics": {"port_tokens": None, "compared": "tokens"}, "original_digest": tree_digest(original)}
    (bundle / "report.json").write_text(json.dumps({**base, **report}))
    return bundle


def _original(tmp_path: Path) -> Path:
    return write_model(tmp_path / "original")


def _verify(bundle: Path, original: Path | None, tmp_path: Path) -> Any:
    from agents.deploy import verify_bundle

    return verify_bundle(bundle, original, workdir=tmp_path / "verify", run_timeout_s=120)


def test_a_report_path_is_never_bound(tmp_path: Path, sim_home: Path) -> None:
    """The report names a credential file of the home as the emulator's op matrix: verify resolves the target on
    this host, so the bundle's code (which opens every path its report named) finds nothing to print."""
    home = sim_home  # NPUPORT_HOME (set by the fixture: the bench runs these without one of its own)
    secret = home / "registry-auth.json"  # a registry's credential file is JSON, as an op matrix is
    secret.write_text(json.dumps({"auths": {"registry.example": {"auth": SECRET}}}))
    original = _original(tmp_path)
    bundle = _bundle(tmp_path, original, {
        "request": {"model_path": str(original), "target": "ascend-sim", "chip": "910b", "torch_npu": "2.13.0"},
        "target": {"name": "ascend-sim", "options": {"matrix_path": str(secret), "chip": "910b"}}},
        steal=[str(secret)])
    res = _verify(bundle, original, tmp_path)
    text = "\n".join(res.lines())
    assert SECRET not in text and "STOLEN" not in text, text
    # and whatever a target's options say, a run binds only npuport's own caches (the matrices, the native engine)
    from sandbox.harness.runner import _mounts
    from sandbox.targets import Target

    mounts = _mounts(tmp_path, original, tmp_path / "run", Target("ascend-sim", "npu", None,
                                                                  {"matrix_path": str(secret)}, {}))
    assert secret.resolve() not in mounts.ro and secret not in mounts.ro


def test_a_report_interpreter_never_runs(tmp_path: Path) -> None:
    """The report names an interpreter of its author's choosing as the port's environment: verify resolves the
    environment from the original on this host and never starts it (it leaves a mark where it starts)."""
    fake_python = tmp_path / "evil" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(f"#!/bin/sh\ntouch ./evil-interpreter-ran 2>/dev/null\nexec {sys.executable} \"$@\"\n")
    fake_python.chmod(0o755)
    original = _original(tmp_path)
    bundle = _bundle(tmp_path, original, {"environment": {"python": str(fake_python)}})
    _verify(bundle, original, tmp_path)
    assert not list(tmp_path.rglob("evil-interpreter-ran")), "verify ran the interpreter the report named"


def test_without_original_nothing_is_copied(tmp_path: Path) -> None:
    """Without --original verify once copied the folder the report names (any folder: ~/.ssh, $NPUPORT_HOME) and
    ran the bundle's code over it. Now it copies nothing, runs nothing, and says "not verified"."""
    private = tmp_path / "private"
    private.mkdir()
    (private / "id_rsa").write_text(SECRET)
    original = _original(tmp_path)
    bundle = _bundle(tmp_path, original, {"request": {"model_path": str(private), "target": "cpu"}})
    res = _verify(bundle, None, tmp_path)
    assert res.outcome == "not verified", res.lines()
    assert not (tmp_path / "verify").exists()
    copies = [p for p in tmp_path.rglob("id_rsa") if p != private / "id_rsa"]
    assert not copies, copies


def test_the_cli_requires_the_original(tmp_path: Path) -> None:
    original = _original(tmp_path)
    bundle = _bundle(tmp_path, original, {})
    done = subprocess.run([sys.executable, "-m", "api.cli", "verify", str(bundle)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and "original" in (done.stdout + done.stderr).lower(), done.stdout + done.stderr


def test_an_unchecked_claim_is_not_verified(tmp_path: Path) -> None:
    """A bundle claiming a validated NPU port at an absurd throughput, verified on a host without an NPU: not
    one of its claims can be checked, so `npuport verify B && deploy` stops (exit 4, "not verified")."""
    original = _original(tmp_path)
    bundle = _bundle(tmp_path, original, {
        "request": {"model_path": str(original), "target": "npu", "chip": "910b", "torch_npu": "2.13.0"},
        "target": {"name": "npu"}, "numerics": {"port_tokens": [[1, 2, 3]], "verdict": "match"},
        "tuning": {"best": {"batch": 8}, "tuned": {"tokens_per_s": 1e9, "concurrency": 8}}})
    from sandbox.targets import get_target_spec

    spec = get_target_spec("npu")
    if spec.probe is not None and spec.probe()[0]:
        pytest.skip("this host has an NPU: the claim can be checked here")
    done = subprocess.run([sys.executable, "-m", "api.cli", "verify", str(bundle), "--original", str(original)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 4, done.stdout + done.stderr
    assert "not verified" in done.stdout


def test_another_original_runs_nothing(tmp_path: Path) -> None:
    """The report's digest of the original must be the folder's the user named: a bundle made from other code
    is not run over this one (and a swapped original is not verified)."""
    original = _original(tmp_path)
    bundle = _bundle(tmp_path, original, {})
    other = write_model(tmp_path / "other", attack="X = 1")
    res = _verify(bundle, other, tmp_path)
    assert res.outcome == "not verified" and "digest" in res.lines()[-1], res.lines()
    assert not (tmp_path / "verify").exists()


@pytest.mark.parametrize("what", ["link-out", "report-shape"])
def test_a_bundle_that_reaches_out_is_not_verified(tmp_path: Path, what: str) -> None:
    original = _original(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    if what == "link-out":
        bundle = _bundle(tmp_path, original, {})
        (bundle / "patched" / "notes.txt").symlink_to(secret)
    else:  # a config path that climbs out, a version no table lists
        bundle = _bundle(tmp_path, original, {"entry": {**__import__("yaml").safe_load(MANIFEST),
                                                        "config": "../../secret.txt"}})
    res = _verify(bundle, original, tmp_path)
    assert res.outcome == "not verified", res.lines()
    assert SECRET not in "\n".join(res.lines())
    bad_version = _bundle(tmp_path / "v", original,
                          {"request": {"model_path": "x", "torch_npu": "2.13.0\n--index-url"}})
    assert _verify(bad_version, original, tmp_path / "v").outcome == "not verified"


def test_masks_hold_after_binds(tmp_path: Path, npuport_home: Path) -> None:
    """A path a caller binds (once: a report's option) can never lift a mask: binding a folder that holds
    NPUPORT_HOME or a home leaves them masked (the masks come again after the binds), the host's root is
    refused, and the root-only /etc files stay masked after a bind of /etc."""
    from sandbox.isolation.bwrap import bwrap_command
    from sandbox.isolation.process import BubblewrapSandbox, Limits, Mounts, bwrap_available, scrubbed_env

    bwrap = bwrap_available()
    if bwrap is None:
        pytest.skip("bubblewrap is not installed here")
    home = npuport_home.resolve()  # NPUPORT_HOME, set by the fixture
    (home / "masked-secret.txt").write_text(SECRET)
    box = BubblewrapSandbox(bwrap)
    for over in (home.parent, home):
        res = box.execute(["cat", str(home / "masked-secret.txt")], cwd=tmp_path, env=scrubbed_env(),
                          limits=Limits(wall_s=30), mounts=Mounts(ro=(over,), rw=(tmp_path,)))
        assert SECRET not in res.stdout and res.returncode != 0, (over, res.stdout, res.stderr)
    with pytest.raises(ValueError, match="root"):
        bwrap_command(bwrap, ["true"], cwd=tmp_path, mounts=Mounts(ro=(Path("/"),)), limits=Limits())
    cmd = bwrap_command(bwrap, ["true"], cwd=tmp_path, mounts=Mounts(ro=(Path("/etc"),)), limits=Limits())
    etc_bind = max(i for i, a in enumerate(cmd) if a == "--ro-bind" and cmd[i + 1] == "/etc")
    masked = [i for i, a in enumerate(cmd) if a == "--ro-bind" and cmd[i + 1] == "/dev/null"]
    if masked:  # root-only files exist under /etc here
        assert max(masked) > etc_bind
