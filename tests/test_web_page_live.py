"""The web page's promises, in a real Chromium (Playwright driving the system browser) against the real
server with the quick stand-in graph (tests/test_api_helpers.py): the job list tracks each job's state
live (queued -> running -> validated) without a reload, Approve stays disabled until the pending diff is
on the page, the token `npuport serve` keeps in the home survives a server restart with the jobs made
before it, the goal's placeholder is a goal the server accepts, and in a 420 px window a report with a
wide table never scrolls the page sideways."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from langgraph.graph import END, START, StateGraph
from test_api_helpers import FAKE_NODES, _fake_node, free_port, wait_http

from api.app import create_app
from api.serve import home_token
from graph.state import PortState
from knowledge.settings import ServiceSettings as Settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
WIDE_TABLE = ("\n## Findings\n\n| hazard | where | what | resolution |\n|---|---|---|---|\n"
              + "".join(f"| H{i} blocks running, high | "
                        f"very/deep/folder/structure/of/the/model/modeling_{'x' * 40}.py:{i} | "
                        f"`torch.cuda.{'synchronize' * 6}()` | {'NOT changed: ' * 4}{'y' * 80} |\n" for i in range(6))
              + f"\nA long path: /srv/models/{'z' * 160}/modeling.py\n")


def wide_report_builder() -> StateGraph[Any]:
    """The stand-in graph, whose reporter writes a report with a wide table and an unbroken long path."""
    fake_reporter = _fake_node("reporter")

    def reporter(state: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = fake_reporter(state)
        md = Path(out["bundle"]["dir"]) / "report.md"
        md.write_text(md.read_text() + WIDE_TABLE)
        return out

    g: StateGraph[Any] = StateGraph(PortState)
    for n in FAKE_NODES:
        g.add_node(n, reporter if n == "reporter" else _fake_node(n))
    g.add_edge(START, FAKE_NODES[0])
    for a, b in zip(FAKE_NODES, FAKE_NODES[1:], strict=False):
        g.add_edge(a, b)
    g.add_edge(FAKE_NODES[-1], END)
    return g


@contextmanager
def server(settings: Settings, port: int) -> Iterator[str]:
    srv = uvicorn.Server(uvicorn.Config(create_app(settings, graph_builder=wide_report_builder), host="127.0.0.1",
                                        port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        t.join(15)


@pytest.fixture()
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def roots(tmp_path: Path) -> Path:
    (tmp_path / "models" / "m1").mkdir(parents=True)
    return tmp_path / "models"


def submit(base: str, token: str, **body: Any) -> str:
    r = httpx.post(f"{base}/v1/ports", headers={"Authorization": f"Bearer {token}"},
                   json={"request": {"model_path": "m1", "target": "cpu"}, **body})
    assert r.status_code in (200, 201, 202), r.text
    return str(r.json()["id"])


def list_state(page: Any, job_id: str) -> str:
    return str(page.evaluate(f"(document.querySelector(\"#jobs li[data-id='{job_id}'] .st\") || {{}}).textContent"
                             " || ''"))


def test_job_list_tracks_state_live_and_a_narrow_window_does_not_overflow(
        npuport_home: Path, roots: Path, browser: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.6")  # ~3 s per job: each state lasts long enough to be seen
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[roots], workers=1)
    with server(settings, free_port()) as base:
        first = submit(base, "tok")
        second = submit(base, "tok")  # one worker: it waits in the queue while the first runs
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(f"{base}/#token=tok")
        page.wait_for_selector(f"#jobs li[data-id='{second}']")
        seen: dict[str, list[str]] = {first: [], second: []}
        deadline = time.time() + 60
        while not all(seen[j] and seen[j][-1] == "validated" for j in seen):  # no reload, no click
            assert time.time() < deadline, seen
            for j in seen:
                st = list_state(page, j)
                if st and (not seen[j] or seen[j][-1] != st):
                    seen[j].append(st)
            time.sleep(0.1)
        assert "queued" in seen[second] and "running" in seen[second], seen
        assert seen[second].index("queued") < seen[second].index("running") < seen[second].index("validated"), seen
        assert "running" in seen[first], seen

        # the report of the second job, in a narrow window: its wide table scrolls in its own box
        page.click(f"#jobs li[data-id='{second}']")
        page.wait_for_function("document.body.dataset.done === '1' && document.querySelector('#report table')")
        page.set_viewport_size({"width": 420, "height": 900})
        # the rows carry unbroken text far wider than the window (the case that overflowed)
        assert page.evaluate("document.querySelectorAll('#report table tr')[1].textContent.length") > 300
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], width


def test_approve_is_disabled_until_its_diff_is_on_the_page(npuport_home: Path, roots: Path, browser: Any) -> None:
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[roots])
    with server(settings, free_port()) as base:
        job = submit(base, "tok", require_approval=True)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        held: list[Any] = []
        page.route("**/v1/ports/*/pending", lambda route: held.append(route))  # answered when the test says
        page.goto(f"{base}/#job={job}&token=tok")
        page.wait_for_function("document.getElementById('status').textContent === 'awaiting_approval'",
                               timeout=30_000)
        page.wait_for_selector("#review:not(.hidden)")
        deadline = time.time() + 10
        while not held:
            assert time.time() < deadline, "the page never asked for the pending diff"
            page.wait_for_timeout(100)
        # the diff is on its way: nothing can be approved yet
        assert page.is_disabled("#approve")
        assert page.inner_text("#pendingDiff") == ""
        page.click("#approve", force=True)  # a click on the disabled button does nothing
        assert httpx.get(f"{base}/v1/ports/{job}", headers={"Authorization": "Bearer tok"}).json()["status"] \
            == "awaiting_approval"
        route = held.pop()
        route.fulfill(response=route.fetch())  # the server's own answer, now
        page.wait_for_function("!document.getElementById('approve').disabled")
        assert page.inner_text("#pendingDiff") != "" and page.inner_text("#pendingList") != ""
        page.click("#approve")
        page.wait_for_function("document.getElementById('status').textContent === 'validated'", timeout=30_000)


def test_the_serve_token_and_the_jobs_survive_a_restart(npuport_home: Path, roots: Path, browser: Any) -> None:
    port = free_port()  # the same address after the restart: the page keeps its token per origin

    def settings() -> Settings:  # as `npuport serve` does without NPUPORT_TOKENS: the token kept in the home
        token, _, _ = home_token(npuport_home)
        return Settings(home=npuport_home, tokens={token: ["read", "write"]}, allowed_roots=[roots])

    first_settings = settings()
    token = next(iter(first_settings.tokens))
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    with server(first_settings, port) as base:
        job = submit(base, token)
        page.goto(f"{base}/#token={token}")
        page.wait_for_function(f"(document.querySelector(\"#jobs li[data-id='{job}'] .st\") || {{}}).textContent"
                               " === 'validated'", timeout=30_000)
    restarted = settings()
    assert list(restarted.tokens) == [token]
    with server(restarted, port) as base:
        page.goto(f"{base}/")  # a plain reload: the token comes from the page's storage, not the address
        page.wait_for_selector(f"#jobs li[data-id='{job}']")
        assert list_state(page, job) == "validated"
        page.click(f"#jobs li[data-id='{job}']")
        page.wait_for_function("document.body.dataset.done === '1'")
        assert "npuport report: fake" in page.inner_text("#report")


def test_the_goal_placeholder_is_a_goal_the_server_accepts(npuport_home: Path, roots: Path, browser: Any) -> None:
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[roots])
    with server(settings, free_port()) as base:
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(f"{base}/#token=tok")
        page.wait_for_function("document.getElementById('goal').placeholder.includes('m1')")
        page.fill("#goal", page.get_attribute("#goal", "placeholder") or "")  # submitted exactly as shown
        page.click("#portBtn")
        page.wait_for_function("document.getElementById('job').textContent !== '-'"
                               " || document.getElementById('formError').textContent !== ''", timeout=30_000)
        assert page.inner_text("#formError") == ""
        page.wait_for_function("document.getElementById('status').textContent === 'validated'", timeout=30_000)
    # a server with no model roots (plain `npuport serve`) names no folder: it asks for an upload
    with server(Settings(home=npuport_home, tokens={"tok": ["read", "write"]}), free_port()) as base:
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(f"{base}/#token=tok")
        page.wait_for_function("document.getElementById('goalHint').textContent.includes('upload')")
        shown = page.get_attribute("#goal", "placeholder") or ""
        assert " in " not in shown and "upload" in shown, shown


def test_the_deployment_is_a_named_phase_on_the_page(npuport_home: Path, roots: Path, browser: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """After the reporter, the deployment phase's steps (env, start, tokens, throughput) show in the live panel's
    deployment row as they happen, and its outcome stays there and in the step list."""
    from test_api_helpers import DEPLOY_PHASES, DEPLOY_SUMMARY, fake_builder_with_deployment

    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.8")
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[roots])
    srv = uvicorn.Server(uvicorn.Config(create_app(settings, graph_builder=fake_builder_with_deployment),
                                        host="127.0.0.1", port=(port := free_port()), log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz")
        job = submit(base, "tok")
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(f"{base}/#job={job}&token=tok")
        seen: list[str] = []
        deadline = time.time() + 60
        while DEPLOY_SUMMARY not in (seen[-1] if seen else ""):
            assert time.time() < deadline, seen
            text = page.inner_text("#liveDeploy")
            if not seen or seen[-1] != text:
                seen.append(text)
            time.sleep(0.1)
        for phase in DEPLOY_PHASES:
            assert phase.removeprefix("deployment: ") in seen, seen
        assert seen.index(DEPLOY_PHASES[1].removeprefix("deployment: ")) < len(seen) - 1  # live, before the end
        page.wait_for_function("document.getElementById('status').textContent === 'validated'", timeout=30_000)
        assert "deployer" in page.inner_text("#events") and DEPLOY_SUMMARY in page.inner_text("#liveDeploy")
    finally:
        srv.should_exit = True
        t.join(15)
