"""`langgraph dev` is a front door like `npuport serve` (issue #42): a real `langgraph dev` with npuport's
langgraph.json, attacked over HTTP. Without a token nothing answers; one token's threads (and the model source
their state holds) are invisible to another; CORS admits Studio's origin only; a text/plain POST from a web page
starts nothing; and the planner confines a run's model and output folders to the roots, whether the folder comes
in a request field or in the goal text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from test_api_helpers import free_port, wait_http  # noqa: E402
from test_langgraph_dev import LANGGRAPH_CMD  # noqa: E402

from .conftest import write_model  # noqa: E402

A = {"Authorization": "Bearer lg-tok-a"}
B = {"Authorization": "Bearer lg-tok-b"}
READER = {"Authorization": "Bearer lg-tok-r"}
TOKENS = {"lg-tok-a": ["read", "write"], "lg-tok-b": ["read", "write"], "lg-tok-r": ["read"]}
STUDIO = "https://smith.langchain.com"

pytestmark = pytest.mark.skipif(not LANGGRAPH_CMD, reason="langgraph-cli is not installed in this environment")


def repo_config(tmp: Path) -> Path:
    """The repo's langgraph.json, its relative paths made absolute (the copy lives in a temporary folder)."""
    config = json.loads((REPO / "langgraph.json").read_text())

    def absolute(ref: str) -> str:
        return str(REPO / ref.removeprefix("./"))

    config["dependencies"] = [str(REPO)]
    config["graphs"] = {k: absolute(v) for k, v in config["graphs"].items()}
    if "auth" in config:
        config["auth"]["path"] = absolute(config["auth"]["path"])
    if "http" in config and "app" in config["http"]:
        config["http"]["app"] = absolute(config["http"]["app"])
    path = tmp / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


class Dev:
    def __init__(self, base: str, roots: Path, home: Path, outside: Path) -> None:
        self.base, self.roots, self.home, self.outside = base, roots, home, outside

    def run(self, headers: dict[str, str], payload: dict[str, object]) -> dict[str, object]:
        thread = httpx.post(f"{self.base}/threads", json={}, headers=headers).json()
        r = httpx.post(f"{self.base}/threads/{thread['thread_id']}/runs/wait", headers=headers, timeout=300,
                       json={"assistant_id": "npuport", "input": payload})
        assert r.status_code == 200, r.text
        return dict(r.json())


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    tmp = tmp_path_factory.mktemp("langgraph-dev")
    roots, home, outside = tmp / "models", tmp / "home", tmp / "outside"
    write_model(roots / "m1")
    write_model(outside / "private-model")
    home.mkdir()
    port = free_port()
    env = {**os.environ, "NPUPORT_HOME": str(home), "NPUPORT_TOKENS": json.dumps(TOKENS),
           "NPUPORT_ALLOWED_ROOTS": str(roots), "PYTHONPATH": str(REPO), "NPUPORT_SERVE": "0", "NPUPORT_KB": "off"}
    env.pop("NPUPORT_SERVICE_PROCESS", None)
    log = open(tmp / "langgraph.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([*LANGGRAPH_CMD, "dev", "--no-browser", "--no-reload", "--port", str(port),
                             "--host", "127.0.0.1", "--config", str(repo_config(tmp))],
                            cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", timeout=180, proc=proc)
        yield Dev(base, roots, home, outside)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()


def test_nothing_answers_without_a_token(dev: Dev) -> None:
    for method, path, body in (("POST", "/threads", {}), ("POST", "/assistants/search", {}),
                               ("POST", "/threads/search", {}), ("POST", "/runs/wait", {"assistant_id": "npuport"}),
                               ("GET", "/v1/ports", None)):
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"x-auth-scheme": "langsmith"}):
            r = httpx.request(method, f"{dev.base}{path}", json=body, headers=headers)
            assert r.status_code in (401, 403), (method, path, headers, r.status_code, r.text[:200])


def test_threads_belong_to_their_token(dev: Dev) -> None:
    thread = httpx.post(f"{dev.base}/threads", json={}, headers=A).json()["thread_id"]
    assert httpx.get(f"{dev.base}/threads/{thread}", headers=A).status_code == 200
    assert httpx.get(f"{dev.base}/threads/{thread}", headers=B).status_code == 404
    assert httpx.get(f"{dev.base}/threads/{thread}/state", headers=B).status_code == 404
    found = httpx.post(f"{dev.base}/threads/search", json={}, headers=B).json()
    assert thread not in [t["thread_id"] for t in found]
    assert httpx.post(f"{dev.base}/threads", json={}, headers=READER).status_code == 403  # read scope: no writes


def test_cors_admits_studio_only(dev: Dev) -> None:
    ask = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    evil = httpx.options(f"{dev.base}/threads", headers={"Origin": "https://evil.example", **ask})
    assert evil.headers.get("access-control-allow-origin") not in ("*", "https://evil.example"), evil.headers
    studio = httpx.options(f"{dev.base}/threads", headers={"Origin": STUDIO, **ask})
    assert studio.headers.get("access-control-allow-origin") == STUDIO, studio.headers


def test_a_web_page_form_starts_nothing(dev: Dev) -> None:
    """A page in the developer's browser may POST text/plain anywhere without a preflight: refused, even with a
    token (a page cannot send one, and the body type alone is refused)."""
    body = json.dumps({"assistant_id": "npuport", "input": {"model_path": str(dev.roots / "m1")}})
    for headers in ({"Content-Type": "text/plain", "Origin": "https://evil.example"},
                    {**A, "Content-Type": "text/plain"}):
        r = httpx.post(f"{dev.base}/runs/wait", content=body, headers=headers)
        assert r.status_code in (401, 403, 415), r.text[:300]


@pytest.mark.parametrize("how", ["field", "goal", "out_dir"])
def test_the_planner_confines_paths_whatever_the_door(dev: Dev, how: str) -> None:
    """A folder outside the roots, named in the form, in the goal text, or as the output folder: the run is
    refused by the planner before any agent reads the folder."""
    private = dev.outside / "private-model"
    payload: dict[str, object] = {
        "field": {"model_path": str(private), "target": "cpu"},
        "goal": {"goal": f"port the model in {private} to Ascend 910B on the cpu"},
        "out_dir": {"model_path": str(dev.roots / "m1"), "target": "cpu", "out_dir": str(dev.outside / "bundle")},
    }[how]
    out = dev.run(A, payload)
    assert out["status"] == "failed" and "outside" in str(out.get("reason")), out
    assert not (dev.outside / "bundle").exists()
    assert "modeling_hostile" not in json.dumps(out)  # nothing of the folder came back
