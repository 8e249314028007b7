"""`langgraph dev` serves Studio's API and ours together (langgraph.json "http": {"app": ...}).

The test writes a temporary langgraph.json (the repo's plus the ``http.app`` entry), starts
`langgraph dev` on a loopback port, calls our /healthz through it and runs the real port graph
through the LangGraph HTTP API on examples/ocr_mini, target cpu."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_api_helpers import free_port, wait_http

REPO = Path(__file__).resolve().parents[1]
_SCRIPT = Path(sys.executable).parent / "langgraph"
# the console script beside this interpreter, else the package itself (a venv layered on another's packages)
LANGGRAPH_CMD = ([str(_SCRIPT)] if _SCRIPT.exists() else
                 [sys.executable, "-m", "langgraph_cli"] if importlib.util.find_spec("langgraph_cli") else [])


@pytest.mark.slow
@pytest.mark.skipif(not LANGGRAPH_CMD, reason="langgraph-cli is not installed in this environment")
def _config(into: Path, *, app: bool = True) -> dict:
    """The repo's langgraph.json with absolute paths (auth, graphs, the app), written into ``into``."""
    config = json.loads((REPO / "langgraph.json").read_text())
    config["dependencies"] = [str(REPO)]
    config["graphs"] = {k: str(REPO / v.removeprefix("./")) for k, v in config["graphs"].items()}
    config["auth"]["path"] = str(REPO / config["auth"]["path"].removeprefix("./"))
    if app:
        config["http"]["app"] = str(REPO / "api" / "app.py") + ":app"
    else:
        config.pop("http", None)
    (into / "langgraph.json").write_text(json.dumps(config))
    return config


TOK = {"Authorization": "Bearer tok"}


def test_langgraph_dev_serves_graph_and_our_app(tmp_path: Path) -> None:
    _config(tmp_path)
    cfg = tmp_path / "langgraph.json"
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    env = {**os.environ, "NPUPORT_HOME": str(home), "NPUPORT_TOKENS": '{"tok": ["read", "write"]}',
           "NPUPORT_ALLOWED_ROOTS": str(REPO / "examples"), "PYTHONPATH": str(REPO)}
    log = open(tmp_path / "langgraph.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([*LANGGRAPH_CMD, "dev", "--no-browser", "--no-reload", "--port", str(port),
                             "--host", "127.0.0.1", "--config", str(cfg)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/healthz", timeout=120, proc=proc)
        health = httpx.get(f"{base}/healthz").json()
        assert health["service"] == "npuport"  # our app, mounted beside LangGraph's API
        assert httpx.get(f"{base}/v1/ports").status_code == 401  # and still behind our auth
        assert httpx.get(f"{base}/v1/ports", headers={"Authorization": "Bearer tok"}).status_code == 200
        assert httpx.post(f"{base}/threads", json={}).status_code == 401  # LangGraph's routes: the same tokens
        thread = httpx.post(f"{base}/threads", json={}, headers=TOK).json()
        run = httpx.post(f"{base}/threads/{thread['thread_id']}/runs/wait", timeout=600, headers=TOK, json={
            "assistant_id": "npuport",
            "input": {"request": {"model_path": str(REPO / "examples" / "ocr_mini"), "target": "cpu",
                                  "out_dir": str(home / "bundle")}}})
        assert run.status_code == 200, run.text
        state = run.json()
        assert state["status"] == "validated", state.get("reason")
        assert json.loads((home / "bundle" / "report.json").read_text())["status"] == "validated"

        # Studio: the graph's input form is typed (not null on 3.11) ...
        (assistant,) = httpx.post(f"{base}/assistants/search", json={"graph_id": "npuport"}, headers=TOK).json()
        schemas = httpx.get(f"{base}/assistants/{assistant['assistant_id']}/schemas", headers=TOK).json()
        assert schemas.get("input_schema"), schemas
        assert {"goal", "model_path", "target", "chip", "messages"} <= set(schemas["input_schema"]["properties"])
        assert {"status", "bundle", "messages"} <= set(schemas["output_schema"]["properties"])
        # ... and its chat input (a human message holding the goal) runs a port that replies in an AI message
        chat = httpx.post(f"{base}/threads", json={}, headers=TOK).json()
        goal = f"port the model in {REPO / 'examples' / 'ocr_mini'} to Ascend 910B on the cpu"
        run = httpx.post(f"{base}/threads/{chat['thread_id']}/runs/wait", timeout=600, headers=TOK, json={
            "assistant_id": "npuport", "input": {"messages": [{"type": "human", "content": goal}],
                                                 "out_dir": str(home / "chat-bundle")}})
        assert run.status_code == 200, run.text
        out = run.json()
        assert out["status"] == "validated", out.get("reason")
        assert out["messages"][0]["type"] == "human" and out["messages"][-1]["type"] == "ai"
        assert "**validated**" in out["messages"][-1]["content"]
        assert str(home / "chat-bundle") in out["messages"][-1]["content"]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.mark.slow
@pytest.mark.skipif(not LANGGRAPH_CMD, reason="langgraph-cli is not installed in this environment")
def test_studio_port_ends_with_a_bundle_and_zero_reloads(tmp_path: Path) -> None:
    """Issue 27: with the file watcher on (Studio's default), a whole port over the HTTP API ends with a
    bundle under $NPUPORT_HOME/jobs/..., named in the reply, and the server never reloads. (The bundle
    used to go to ./npuport-out inside the watched project: the reload cancelled the run, 17 times.)"""
    from tests.tiny_models import write_tiny_model

    project = tmp_path / "project"  # what `langgraph dev` watches: the folder of its langgraph.json
    project.mkdir()
    _config(project, app=False)
    model = write_tiny_model(tmp_path / "models" / "tiny")
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    env = {**os.environ, "NPUPORT_HOME": str(home), "PYTHONPATH": str(REPO), "NPUPORT_TOKENS": "tok=read+write",
           "NPUPORT_ALLOWED_ROOTS": str(tmp_path / "models")}
    log_path = tmp_path / "langgraph.log"
    log = open(log_path, "wb")  # noqa: SIM115
    proc = subprocess.Popen([*LANGGRAPH_CMD, "dev", "--no-browser", "--port", str(port), "--host", "127.0.0.1"],
                            cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/ok", timeout=120, proc=proc)
        thread = httpx.post(f"{base}/threads", json={}, headers=TOK).json()["thread_id"]
        run = httpx.post(f"{base}/threads/{thread}/runs/wait", timeout=600, headers=TOK, json={
            "assistant_id": "npuport", "input": {"model_path": str(model), "target": "cpu"}})
        assert run.status_code == 200, run.text
        state = run.json()
        assert state.get("status") == "validated", (state.get("reason"), log_path.read_text()[-3000:])
        bundle = Path(state["bundle"]["dir"])
        assert bundle.is_relative_to(home / "jobs") and (bundle / "report.json").is_file()
        assert str(bundle) in state["messages"][-1]["content"]  # the reply says where the bundle is
        thread_state = httpx.get(f"{base}/threads/{thread}/state", headers=TOK).json()
        assert thread_state["next"] == [], thread_state["next"]
        assert not (project / "npuport-out").exists()
        text = log_path.read_text(errors="replace")
        for sign in ("Reloading", "WatchFiles detected changes", "CancelledError", "will retry"):
            assert sign not in text, text[-3000:]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
