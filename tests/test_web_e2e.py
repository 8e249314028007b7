"""The web page in a real Chromium (Playwright driving the system browser) against the real server and
the real port graph: a new user with plain `npuport serve` settings (no model roots, so uploads only)
uploads examples/ocr_mini as a zip, picks target and chip from the server's options, asks to approve
each patch round, sees the pending diff, approves, watches the job validate, downloads the bundle and
reads the report. Screenshots land in tmp/artefacts/web/ (kept as CI artefacts, gitignored)."""

from __future__ import annotations

import io
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from test_api_chat import serve_in_thread

from knowledge.settings import ServiceSettings as Settings

REPO = Path(__file__).resolve().parents[1]
ARTEFACTS = REPO / "tmp" / "artefacts" / "web"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")]


def zip_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                zf.write(p, p.relative_to(folder).as_posix())
    return buf.getvalue()


def test_upload_port_approve_download_report(npuport_home: Path, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    archive = tmp_path / "ocr_mini.zip"
    archive.write_bytes(zip_folder(REPO / "examples" / "ocr_mini"))
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]})  # no allowed roots
    for base in serve_in_thread(settings, None):
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
                job_id = _fill_the_form_and_port(page, base, archive)
                assert _watch_and_approve(page, job_id) >= 1
                _check_the_report(page)
                _download_the_bundle(page, tmp_path)
                # the events panel stays in view while the page scrolls
                page.mouse.wheel(0, 3000)
                box = page.locator("#events").bounding_box()
                assert box is not None and box["y"] < 1000 and box["y"] + box["height"] > 0
                # the token is kept (localStorage) and the job list survives a reload of the page
                page.goto(f"{base}/")
                page.wait_for_selector(f"#jobs li[data-id='{job_id}']")
                assert page.inner_text(f"#jobs li[data-id='{job_id}'] .st") == "validated"
            finally:
                browser.close()


def _fill_the_form_and_port(page: Any, base: str, archive: Path) -> str:
    """Upload, pick target and chip from the server's options, ask for approval and a short tuning;
    returns the job id."""
    page.goto(f"{base}/#token=tok")
    # the controls come from the server
    page.wait_for_function("document.querySelectorAll('#chip option').length === 3")
    assert "#token" not in page.url, "the token must leave the address bar"
    page.set_input_files("#archive", str(archive))
    page.select_option("#target", "cpu")
    page.select_option("#chip", "910b")
    page.check("#approval")
    page.check("#tune")  # a short tuning run, so the report has its plots
    page.fill("#trials", "2")
    page.screenshot(path=str(ARTEFACTS / "1-form.png"), full_page=True)
    page.click("#portBtn")
    page.wait_for_function("document.getElementById('job').textContent !== '-'", timeout=60_000)
    job_id = page.inner_text("#job")
    page.wait_for_selector(f"#jobs li[data-id='{job_id}']")  # the job list shows it
    return job_id


def _watch_and_approve(page: Any, job_id: str) -> int:
    """Follow the job to its end, approving every patch round once its diff is shown; the approvals."""
    approvals = 0
    deadline = time.time() + 540
    while page.get_attribute("body", "data-done") != "1":
        assert time.time() < deadline, "the job did not end"
        # Approve is never clickable before its diff is on the page
        assert page.evaluate("document.getElementById('pendingDiff').textContent.length > 0"
                             " || document.getElementById('approve').disabled"), "Approve before its diff"
        # the job list tracks the job's state live (it said "queued" while the job ran)
        state = page.inner_text("#status")
        if state in ("running", "awaiting_approval"):
            page.wait_for_function(
                f"(document.querySelector(\"#jobs li[data-id='{job_id}'] .st\") || {{}}).textContent"
                " === document.getElementById('status').textContent", timeout=10_000)
        if page.inner_text("#status") == "awaiting_approval" and page.is_visible("#review"):
            page.wait_for_function(
                "document.getElementById('pendingDiff').textContent.length > 0", timeout=120_000)
            if approvals == 0:
                diff = page.inner_text("#pendingDiff")
                assert "\n+" in diff and "\n-" in diff, diff[:1000]  # a real diff of the next round
                assert "patch" in page.inner_text("#pendingList")
                page.screenshot(path=str(ARTEFACTS / "2-approval.png"), full_page=True)
            page.click("#approve")
            approvals += 1
            page.wait_for_function("document.getElementById('status').textContent !== 'awaiting_approval'")
        # the live panel shows the agent at work, and the tuning trials
        if "trial" in page.inner_text("#liveTrial") and not (ARTEFACTS / "3-tuning.png").exists():
            page.screenshot(path=str(ARTEFACTS / "3-tuning.png"))
        time.sleep(0.5)
    return approvals


def _check_the_report(page: Any) -> None:
    """The job validated; the report, its plots and every agent's events are on the page, which never
    scrolls sideways in a narrow window."""
    assert (ARTEFACTS / "3-tuning.png").exists(), "the live panel never showed a tuning trial"
    assert page.inner_text("#status") == "validated", page.inner_text("#reason")
    assert page.inner_text("#liveAgent") == "done"
    assert "report" in page.inner_text("#report").lower()
    # the plots are read from the bundle and painted
    page.wait_for_function("[...document.querySelectorAll('#report img')].some(i => i.naturalWidth > 100)",
                           timeout=30_000)
    for agent in ("planner", "code_reader", "patcher", "executor", "validator", "reporter"):
        assert page.locator("#events .agent", has_text=agent).count() >= 1, agent
    page.screenshot(path=str(ARTEFACTS / "4-report.png"), full_page=True)
    # a narrow window: the report's tables scroll inside their own box, the page never sideways
    page.set_viewport_size({"width": 420, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), \
        page.evaluate("document.documentElement.scrollWidth")
    page.screenshot(path=str(ARTEFACTS / "5-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 1400, "height": 1000})


def _download_the_bundle(page: Any, tmp_path: Path) -> None:
    with page.expect_download() as dl:
        page.click("#download")
    saved = tmp_path / "bundle.zip"
    dl.value.save_as(saved)
    with zipfile.ZipFile(saved) as zf:
        names = set(zf.namelist())
        assert {"report.md", "report.json", "port.patch"} <= names
        assert "_npuport_device()" in zf.read("port.patch").decode()
