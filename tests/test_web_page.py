"""The web chat at /, in headless Chromium: it submits a goal, follows the job's events and renders
the final report. Chromium's --dump-dom returns once the page's pending fetches settle, so the
check runs in two loads: the first submits the goal (the job id lands in the DOM); when the job has
ended, the second opens the job's deep link, replays its events and renders the report."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from test_api_chat import serve_in_thread
from test_api_helpers import fake_builder

from knowledge.settings import ServiceSettings as Settings

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
GREEN = (0x1A, 0x7F, 0x37)  # the "validated" badge colour in api/static/index.html


def chromium(url: str, profile: Path, shot: Path) -> str:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--window-size=1100,1400",
           f"--screenshot={shot}", "--dump-dom", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def wait_done(base: str, job_id: str, timeout: float) -> dict[str, object]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = httpx.get(f"{base}/v1/ports/{job_id}", headers={"Authorization": "Bearer tok"}).json()
        if job["status"] in ("validated", "failed", "cancelled"):
            return dict(job)
        time.sleep(0.3)
    raise AssertionError("job did not end")


def green_pixels(png: Path) -> int:
    import numpy as np
    from PIL import Image

    with Image.open(png) as im:
        rgb = np.asarray(im.convert("RGB")).astype(int)
    return int((np.abs(rgb - np.array(GREEN)) <= 6).all(axis=2).sum())


def run_page(base: str, tmp_path: Path, goal: str, timeout: float) -> tuple[str, str, Path]:
    first = chromium(f"{base}/#goal={quote(goal)}&token=tok", tmp_path / "p1", tmp_path / "submit.png")
    assert 'id="job">' in first
    job_id = first.split('id="job">')[1].split("<")[0]
    assert job_id and job_id != "-", first[-2000:]
    job = wait_done(base, job_id, timeout)
    for attempt in range(3):  # on a loaded runner the dump can come before the page's last fetch settled
        dom = chromium(f"{base}/#job={job_id}&token=tok", tmp_path / f"p2-{attempt}", tmp_path / "final.png")
        if 'data-done="1"' in dom:
            break
    assert job["status"] == "validated"
    return job_id, dom, tmp_path / "final.png"


def check_final(dom: str, shot: Path, agents: tuple[str, ...], report_heading: str) -> None:
    assert 'data-done="1"' in dom
    assert 'id="status" class="validated">validated<' in dom
    for agent in agents:
        assert f'<span class="agent">{agent}</span>' in dom
    assert report_heading in dom  # report.md rendered as HTML
    assert shot.stat().st_size > 20_000
    # the green "validated" badge is really painted (not just present in the DOM)
    assert green_pixels(shot) > 800


@pytest.fixture()
def fake_base(npuport_home: Path, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "models" / "m1").mkdir(parents=True)
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[tmp_path / "models"])
    yield from serve_in_thread(settings, fake_builder)


def test_page_submits_and_renders_events_and_report(fake_base: str, tmp_path: Path) -> None:
    _, dom, shot = run_page(fake_base, tmp_path, "port the model in m1 on the cpu", 60)
    check_final(dom, shot, ("planner", "code_reader", "patcher", "executor", "reporter"),
                "<h2>npuport report: fake</h2>")


def test_page_without_token_shows_the_error(fake_base: str, tmp_path: Path) -> None:
    dom = chromium(f"{fake_base}/#goal={quote('port the model in m1')}", tmp_path / "p", tmp_path / "s.png")
    assert 'class="error"' in dom and "missing bearer token" in dom


@pytest.mark.slow
def test_page_with_a_real_port(npuport_home: Path, tmp_path: Path) -> None:
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[REPO / "examples"])
    for base in serve_in_thread(settings, None):
        _, dom, shot = run_page(base, tmp_path, "port the model in ocr_mini to Ascend 910B on the cpu", 500)
        check_final(dom, shot, ("planner", "code_reader", "patcher", "executor", "validator", "reporter"),
                    "<h2>npuport report: ocr_mini</h2>")
