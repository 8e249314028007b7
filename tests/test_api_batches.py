"""/v1/batches through the real app (TestClient) with real ports on the local executor: owner rules
(another token gets 404, an admin sees all), path confinement, the status with results, and SSE."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api_helpers import sse_events

from api.app import create_app
from knowledge.settings import ServiceSettings as Settings

A = {"Authorization": "Bearer tok-a"}
B = {"Authorization": "Bearer tok-b"}
ADMIN = {"Authorization": "Bearer tok-admin"}


@pytest.fixture()
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for name in ("m1", "m2"):  # folders without Python: each port fails quickly, in its code_reader
        (root / name).mkdir(parents=True)
        (root / name / "README.md").write_text("no code\n")
    return root


@pytest.fixture()
def client(npuport_home: Path, roots: Path) -> Iterator[TestClient]:
    settings = Settings(home=npuport_home, allowed_roots=[roots],
                        tokens={"tok-a": ["read", "write"], "tok-b": ["read", "write"],
                                "tok-admin": ["read", "admin"]})
    with TestClient(create_app(settings)) as c:
        yield c


def _manifest(*names: str) -> dict[str, Any]:
    return {"name": "zoo", "defaults": {"target": "cpu"}, "models": [{"path": n} for n in names]}


def _wait_done(c: TestClient, bid: str, timeout: float = 120, headers: dict[str, str] = A) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        body = c.get(f"/v1/batches/{bid}", headers=headers).json()
        if body["status"] == "done":
            return body
        time.sleep(0.5)
    raise AssertionError(f"batch {bid} not done: {body}")


def test_batches_owner_rules_results_and_events(client: TestClient) -> None:
    r = client.post("/v1/batches", json={"manifest": _manifest("m1", "m2"), "executor": "local"}, headers=A)
    assert r.status_code == 201, r.text
    bid = r.json()["id"]
    assert r.headers["Location"] == f"/v1/batches/{bid}"
    # another token: 404 for the batch and its events, and an empty list; the admin sees it
    assert client.get(f"/v1/batches/{bid}", headers=B).status_code == 404
    assert client.get(f"/v1/batches/{bid}/events?stream=false", headers=B).status_code == 404
    assert client.get("/v1/batches", headers=B).json() == []
    assert [b["id"] for b in client.get("/v1/batches", headers=ADMIN).json()] == [bid]
    assert client.get(f"/v1/batches/{bid}", headers=ADMIN).status_code == 200
    done = _wait_done(client, bid)
    assert done["counts"] == {"queued": 0, "running": 0, "validated": 0, "failed": 2}
    rows = {row["model"]: row for row in done["results"]}
    assert set(rows) == {"m1", "m2"} and all("no Python files" in row["reason"] for row in rows.values()), rows
    events = list(sse_events(client, f"/v1/batches/{bid}/events", A, limit_s=60))
    kinds = [e.get("event") for e in events]
    assert kinds[-1] == "end" and kinds[0] == "batch"
    port_events = [json.loads(e["data"])["data"] for e in events if e.get("event") == "port"]
    assert {(p["model"], p["status"]) for p in port_events} >= {("m1", "failed"), ("m2", "failed")}
    steps = [json.loads(e["data"])["data"] for e in events if e.get("event") == "step"]
    assert {s["model"] for s in steps} == {"m1", "m2"} and any(s["agent"] == "planner" for s in steps)
    # resuming after the last event id gives nothing but the end
    last = [e["id"] for e in events if e.get("id")][-1]
    rest = list(sse_events(client, f"/v1/batches/{bid}/events", {**A, "Last-Event-ID": last}, limit_s=30))
    assert [e.get("event") for e in rest] == ["end"]
    # the same manifest from the same token is the same batch (200, nothing rerun); from another token, a new one
    again = client.post("/v1/batches", json={"manifest": _manifest("m1", "m2"), "executor": "local"}, headers=A)
    assert again.status_code == 200 and again.json()["id"] == bid
    other = client.post("/v1/batches", json={"manifest": _manifest("m1", "m2"), "executor": "local"}, headers=B)
    assert other.status_code == 201 and other.json()["id"] != bid
    _wait_done(client, bid)
    _wait_done(client, other.json()["id"], headers=B)  # no driver outlives the test
    assert all(p["attempts"] == 1 for p in client.get(f"/v1/batches/{bid}", headers=A).json()["ports"])


def test_batch_inputs_are_checked(client: TestClient, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    r = client.post("/v1/batches", json={"manifest": _manifest(str(outside))}, headers=A)
    assert r.status_code == 403
    r = client.post("/v1/batches", json={"manifest": {"models": [{"path": "m1", "target": "tpu"}]}}, headers=A)
    assert r.status_code == 422 and "target" in r.text
    assert client.post("/v1/batches", json={"manifest": _manifest("m1")}, headers=ADMIN).status_code == 403
    assert client.get("/v1/batches/nope", headers=A).status_code == 404
    assert client.get("/v1/batches", headers={}).status_code == 401


def test_ports_and_batches_answer_the_owner_rule_alike(client: TestClient) -> None:
    """One owner rule (api.auth.can_see / owner_filter) serves both routers: for the owner, another token
    and an admin, a port job and a batch of the same token are visible (or 404) alike, in lists too."""
    import api.routers.batches as batches
    import api.routers.ports as ports
    from api.auth import Principal, can_see, owner_filter

    assert ports.can_see is batches.can_see is can_see
    assert ports.owner_filter is batches.owner_filter is owner_filter
    owner, other = Principal("a", frozenset({"read"})), Principal("b", frozenset({"read", "write"}))
    admin = Principal("c", frozenset({"read", "admin"}))
    assert [can_see(p, "a") for p in (owner, other, admin)] == [True, False, True]
    assert [owner_filter(p) for p in (owner, other, admin)] == ["a", "b", None]

    job = client.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=A)
    assert job.status_code == 201, job.text
    bid = client.post("/v1/batches", json={"manifest": _manifest("m2"), "executor": "local"}, headers=A).json()["id"]
    jid = job.json()["id"]
    for who, seen in ((A, True), (B, False), (ADMIN, True)):
        want = 200 if seen else 404
        assert client.get(f"/v1/ports/{jid}", headers=who).status_code == want
        assert client.get(f"/v1/batches/{bid}", headers=who).status_code == want
        assert client.get(f"/v1/ports/{jid}/events?stream=false", headers=who).status_code == want
        assert client.get(f"/v1/batches/{bid}/events?stream=false", headers=who).status_code == want
        assert (jid in [j["id"] for j in client.get("/v1/ports", headers=who).json()]) is seen
        assert (bid in [b["id"] for b in client.get("/v1/batches", headers=who).json()]) is seen
    _wait_done(client, bid)
