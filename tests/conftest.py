"""Shared fixtures. Reference data lives in ../shared/data beside the checkout (CI has a copy)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Tests port the repository's own example models: where bubblewrap is missing they may run them
# unisolated, as the CLI does (tests/security skips its bwrap half there; CI installs bwrap).
os.environ.setdefault("NPUPORT_ALLOW_UNISOLATED", "1")
# Serving a port takes minutes; the few tests that exercise the deployment ask for it (tests/test_serving.py).
os.environ.setdefault("NPUPORT_SERVE", "0")
EXAMPLES = REPO_ROOT / "examples"


def _shared_data_dir() -> Path | None:
    env = os.environ.get("NPUPORT_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = _shared_data_dir()
    if d is None:
        pytest.skip("../shared/data (public Ascend reference data) is not beside this checkout")
    return d


@pytest.fixture(autouse=True)
def _not_a_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as the CLI's process, not a service's: a test that built the app (or Studio's graph)
    in-process marked the worker a service (agents/doors.py ``mark_service``, an environment variable), and every
    later port in that worker was confined to the (unset) model roots."""
    monkeypatch.delenv("NPUPORT_SERVICE_PROCESS", raising=False)


@pytest.fixture()
def npuport_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private npuport home per test, so tests never touch the user's."""
    home = tmp_path / "npuport-home"
    home.mkdir()
    monkeypatch.setenv("NPUPORT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One npuport home for the session's tests that need the torch_npu 2.13.0 op-support matrix:
    it is built once (from the wheel, cached in NPUPORT_WHEEL_CACHE) and reused."""
    home = tmp_path_factory.mktemp("npuport-session-home")
    os.environ.setdefault("NPUPORT_WHEEL_CACHE", str(Path.home() / ".cache" / "npuport-tests" / "wheels"))
    return home


@pytest.fixture()
def sim_home(session_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NPUPORT_HOME", str(session_home))
    return session_home


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow end-to-end tests first (stable order otherwise): on two workers they start early instead of
    leaving one worker alone with the longest of them at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture()
def one_ray_at_a_time() -> Iterator[None]:
    """Tests that start Ray hold this lock: `ray stop --force` in one of them ends every Ray on the host, and
    two workers' embedded clusters would otherwise run side by side."""
    import fcntl

    with open(Path(tempfile.gettempdir()) / "npuport-tests-ray.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
