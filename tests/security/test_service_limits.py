"""Class: client-chosen endpoints and unbounded numbers. Every number a client sends has a server-side
ceiling, the Ray cluster is the operator's choice only, and a cancel kills the sandbox run in flight
(not after it ends, which could be hours)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from langgraph.graph import END, START, StateGraph
from test_api import make_settings
from test_api_helpers import fake_builder

from api.app import create_app
from graph.state import PortState
from sandbox.isolation.process import Limits, Sandbox, scrubbed_env, stop_runs_when

from .conftest import api_client

A = {"Authorization": "Bearer tok-a"}


@pytest.fixture()
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    (root / "m1" / "npuport.yaml").write_text("name: m1\n")
    return root


def _client(home: Path, roots: Path, builder: Any = fake_builder) -> TestClient:
    return TestClient(create_app(make_settings(home, roots, tokens={"tok-a": ["read", "write"]}),
                                 graph_builder=builder))


@pytest.fixture()
def client(service_home: Path, service_roots: Path) -> Iterator[httpx.Client]:
    """The service: a live `npuport serve` over HTTP (bench/security.py --serve), else the app in-process."""
    with api_client(service_home, service_roots, {"tok-a": ["read", "write"]}) as c:
        yield c


@pytest.mark.parametrize("field", ["run_timeout_s", "max_wall_s", "tune_time_s"])
def test_huge_finite_numbers_are_refused(client: httpx.Client, field: str) -> None:
    """1e12 s is finite and positive, and forever: the service refuses it rather than running it."""
    r = client.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu", field: 1e12}}, headers=A)
    assert r.status_code == 422, r.text


def test_batch_budgets_are_capped(client: httpx.Client) -> None:
    manifest = {"name": "b", "defaults": {"budget": {"run_timeout_s": 1e12}, "timeout_s": 1e12},
                "models": [{"path": "m1"}]}
    r = client.post("/v1/batches", json={"manifest": manifest, "executor": "local"}, headers=A)
    assert r.status_code == 422, r.text


def test_a_client_cannot_choose_the_ray_cluster(client: httpx.Client) -> None:
    """Ray Client exchanges pickles with whatever answers at that address, and ray.init is process-wide:
    the address is the operator's (RAY_ADDRESS of the service), never a request field."""
    manifest = {"name": "b", "models": [{"path": "m1"}]}
    r = client.post("/v1/batches", json={"manifest": manifest, "executor": "ray",
                                         "ray_address": "ray://attacker.example:10001"}, headers=A)
    assert r.status_code == 422, r.text
    assert "operator" in r.text


def test_cancel_kills_the_sandbox_run_in_flight(box: Sandbox, tmp_path: Path) -> None:
    stop = threading.Event()
    out: list[Any] = []

    def go() -> None:
        with stop_runs_when(stop.is_set):
            out.append(box.execute(["sh", "-c", "sleep 60"], cwd=tmp_path, env=scrubbed_env(),
                                   limits=Limits(wall_s=120)))

    t = threading.Thread(target=go)
    t0 = time.monotonic()
    t.start()
    time.sleep(1.0)
    stop.set()
    t.join(30)
    assert out, "the run outlived the cancel"
    res = out[0]
    assert time.monotonic() - t0 < 10 and res.status == "killed", res
    assert any("cancelled" in n for n in res.notes)


def _sleeping_builder(marker: Path) -> Any:
    """A one-node graph whose node is a 60 s sandbox run (what a slow port step is)."""

    def node(state: dict[str, Any]) -> dict[str, Any]:
        from sandbox.isolation.process import default_sandbox

        marker.write_text("started")
        res = default_sandbox(allow_process=True).execute(["sh", "-c", "sleep 60"], cwd=marker.parent,
                                                           env=scrubbed_env(), limits=Limits(wall_s=120))
        return {"status": "failed", "reason": f"run ended: {res.status}"}

    def build() -> StateGraph[Any]:
        g: StateGraph[Any] = StateGraph(PortState)
        g.add_node("executor", node)
        g.add_edge(START, "executor")
        g.add_edge("executor", END)
        return g

    return build


def test_cancelling_a_job_kills_its_running_sandbox(npuport_home: Path, roots: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with _client(npuport_home, roots, _sleeping_builder(marker)) as c:
        r = c.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=A)
        assert r.status_code in (200, 201, 202), r.text
        jid = r.json()["id"]
        deadline = time.time() + 30
        while time.time() < deadline and not marker.exists():
            time.sleep(0.1)
        assert marker.exists(), "the job never started its run"
        time.sleep(0.5)
        t0 = time.monotonic()
        assert c.post(f"/v1/ports/{jid}/cancel", headers=A).status_code in (200, 202)
        job: dict[str, Any] = {}
        while time.monotonic() - t0 < 30:
            job = c.get(f"/v1/ports/{jid}", headers=A).json()
            if job["status"] in ("cancelled", "failed", "validated"):
                break
            time.sleep(0.1)
        assert job["status"] == "cancelled", job
        assert time.monotonic() - t0 < 15, "the cancel waited for the run to end"
