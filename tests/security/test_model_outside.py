"""Class: nothing of the model runs outside the sandbox. A layered env holds wheels the model's imports
chose, and a wheel can carry a ``.pth``: starting that env's interpreter runs it. Every question npuport
asks such an interpreter (versions for the bundle, missing transformers names, the torch build for the
native engine, the torch pair probe) runs under bwrap, so the .pth runs confined too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.process import bwrap_available


@pytest.fixture()
def hostile_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A venv whose site-packages carries a .pth that, when the interpreter starts, writes a marker
    next to the server's files (the test's folder, which a confined run cannot reach)."""
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed here (.ci/run installs it)")
    monkeypatch.setenv("NPUPORT_ISOLATION", "auto")
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # never plant the .pth anywhere but this venv (the base interpreter's site-packages is shared)
    assert Path(site).is_relative_to(venv), site
    marker = tmp_path / "outside" / "pwned"
    marker.parent.mkdir()
    (Path(site) / "evil.pth").write_text(
        f"import os; open({str(marker)!r}, 'a').write('ran as uid %d\\n' % os.getuid())\n")
    # the .pth does run when the interpreter starts unconfined (the attack is real)
    subprocess.run([str(py), "-c", "pass"], check=True)
    assert marker.exists()
    marker.unlink()
    return str(py), marker


def test_bundle_version_probe_runs_the_env_confined(hostile_env: tuple[str, Path]) -> None:
    from agents.deploy.requirements import env_versions

    py, marker = hostile_env
    env_versions(py, ["pip"])
    assert not marker.exists(), marker.read_text()


def test_torch_identity_runs_the_env_confined(hostile_env: tuple[str, Path]) -> None:
    from knowledge.errors import NativeUnavailable
    from sandbox.ascend_sim.native_build import _torch_identity

    py, marker = hostile_env
    with pytest.raises(NativeUnavailable):  # no torch in this env; the .pth ran first either way
        _torch_identity(py)
    assert not marker.exists(), marker.read_text()


def test_torch_pair_probe_runs_the_env_confined(hostile_env: tuple[str, Path]) -> None:
    from agents.env_torch import probe

    py, marker = hostile_env
    ok, _ = probe(py, [], timeout_s=60)
    assert not ok and not marker.exists()


def test_purelib_question_runs_no_pth(hostile_env: tuple[str, Path]) -> None:
    from agents.env_resolve import _purelib

    py, marker = hostile_env
    assert _purelib(Path(py)) == str(Path(py).parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages")
    assert not marker.exists()


def test_a_probe_sees_no_host_secret_and_cannot_write(hostile_env: tuple[str, Path], tmp_path: Path) -> None:
    from sandbox.probe import run_probe

    py, _ = hostile_env
    secret = tmp_path / "outside" / "token.txt"
    secret.write_text("server-token-19ab")
    code = (f"import os\ntry:\n    print(open({str(secret)!r}).read())\nexcept OSError as e:\n    print('no', e)\n"
            "print('uid', os.getuid())")
    done = run_probe([py, "-c", code], timeout=30)
    assert "server-token-19ab" not in done.stdout and "uid 0" not in done.stdout, done.stdout
