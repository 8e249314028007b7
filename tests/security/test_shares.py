"""Shares and memory (issue #42): one owner cannot take the service from the others, and one run cannot take
the host's memory. Batches run in the service's worker pool under the operator's cap (a client's ``workers``
only lowers it) and can be cancelled; each token has a share of the queue, of the workers and of the disk its
uploads hold; an upload goes when its job ends; a run's memory is capped as a whole (all its processes and
its /tmp), and a service that cannot cap it refuses to run ports; no client string reaches a download."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from langgraph.graph import END, START, StateGraph
from test_api import make_settings

from api.app import create_app
from graph.state import PortState
from sandbox.isolation.process import Limits, Sandbox, scrubbed_env

from .conftest import SERVE_TOKENS, api_client, in_process_only, needs_isolation, write_model

A = {"Authorization": "Bearer tok-a"}
B = {"Authorization": "Bearer tok-b"}
TOKENS = {"tok-a": ["read", "write"], "tok-b": ["read", "write"]}


@pytest.fixture()
def client(service_home: Path, service_roots: Path) -> Iterator[httpx.Client]:
    with api_client(service_home, service_roots, SERVE_TOKENS) as c:
        yield c


def _wait(c: Any, path: str, headers: dict[str, str], done: tuple[str, ...], timeout: float = 300) -> dict[str, Any]:
    end, body = time.monotonic() + timeout, {}
    while time.monotonic() < end:
        body = c.get(path, headers=headers).json()
        if body["status"] in done:
            return dict(body)
        time.sleep(0.3)
    raise AssertionError(f"{path} did not end: {body}")


def _slow_models(roots: Path, tag: str, n: int) -> list[str]:
    """Model folders whose import sleeps in the sandbox: each port holds its worker for a while."""
    names = []
    for i in range(n):
        name = f"slow-{tag}-{i}"[:60]
        write_model(roots / name, attack="time.sleep(4)")
        names.append(name)
    return names


def test_batches_run_in_the_pool_under_the_operators_cap(client: httpx.Client, service_roots: Path,
                                                         tmp_path: Path) -> None:
    """A client asks for 64 workers: the batch runs at most the operator's cap of ports at once (2 here, the
    service's workers), in the service's own pool (it once started 4 sandboxes beside NPUPORT_WORKERS=1)."""
    names = _slow_models(service_roots, tmp_path.name[-20:], 3)
    manifest = {"name": f"cap-{tmp_path.name[-20:]}", "defaults": {"target": "cpu"},
                "models": [{"path": n} for n in names]}
    r = client.post("/v1/batches", json={"manifest": manifest, "executor": "local", "workers": 64}, headers=A)
    assert r.status_code == 201, r.text
    bid, most = r.json()["id"], 0
    end = time.monotonic() + 600
    while time.monotonic() < end:
        batch = client.get(f"/v1/batches/{bid}", headers=A).json()
        most = max(most, batch["counts"]["running"])
        if batch["status"] == "done":
            break
        time.sleep(0.2)
    assert batch["status"] == "done", batch
    assert 1 <= most <= 2, f"{most} ports of one batch ran at once; the operator's cap is 2"


def test_a_batch_can_be_cancelled(client: httpx.Client, service_roots: Path, tmp_path: Path) -> None:
    names = _slow_models(service_roots, f"c{tmp_path.name[-20:]}", 3)
    manifest = {"name": f"cancel-{tmp_path.name[-20:]}", "defaults": {"target": "cpu"},
                "models": [{"path": n} for n in names]}
    r = client.post("/v1/batches", json={"manifest": manifest, "executor": "local"}, headers=A)
    assert r.status_code == 201, r.text
    bid = r.json()["id"]
    assert client.post(f"/v1/batches/{bid}/cancel", headers=B).status_code == 404  # another token's: no such batch
    t0 = time.monotonic()
    assert client.post(f"/v1/batches/{bid}/cancel", headers=A).status_code == 200
    batch = _wait(client, f"/v1/batches/{bid}", A, ("cancelled", "done"), timeout=120)
    assert batch["status"] == "cancelled" and time.monotonic() - t0 < 90, batch
    assert all(p["status"] == "failed" for p in batch["ports"]), batch["ports"]
    assert client.post(f"/v1/batches/{bid}/cancel", headers=A).status_code == 409


def test_no_client_version_reaches_a_download(client: httpx.Client) -> None:
    """The op matrix of a torch_npu release is built from its wheel (pip download, outside the sandbox): only the
    compatibility table's releases are accepted, never a client's string."""
    for version in ("9.9.9", "2.13.0 --index-url http://attacker.invalid/simple", "../../x"):
        r = client.post("/v1/ports", json={"request": {"model_path": "m1", "target": "ascend-sim",
                                                       "torch_npu": version}}, headers=A)
        assert r.status_code == 422, (version, r.text)
    from agents.target_state import matrix_for

    path, note = matrix_for("9.9.9")
    assert path is None and "compatibility table" in note


def _zip(size: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("tiny/npuport.yaml", "name: tiny\nentry: {class: m:Tiny}\nconfig: config.json\ninputs: m:f\n")
        zf.writestr("tiny/config.json", "{}")
        zf.writestr("tiny/m.py", "class Tiny:\n    pass\n")
        zf.writestr("tiny/weights.bin", b"\0" * size)
    return buf.getvalue()


def test_an_upload_goes_when_its_job_ends(client: httpx.Client, service_home: Path) -> None:
    before = set((service_home / "uploads").iterdir()) if (service_home / "uploads").is_dir() else set()
    r = client.post("/v1/ports", files={"archive": ("m.zip", _zip(1000), "application/zip")},
                    data={"request": json.dumps({"target": "cpu"})}, headers=A)
    assert r.status_code == 201, r.text
    _wait(client, f"/v1/ports/{r.json()['id']}", A, ("validated", "failed", "cancelled"))
    time.sleep(0.5)
    left = set((service_home / "uploads").iterdir()) - before if (service_home / "uploads").is_dir() else set()
    assert not left, f"uploads left on disk after their job ended: {left}"


# --- in-process: the shares need settings of their own ----------------------------------------------------

def _waiting_builder(release: threading.Event, started: list[str]) -> Any:
    """A one-node graph that holds its worker until ``release`` (a long port step)."""

    def node(state: dict[str, Any]) -> dict[str, Any]:
        started.append(str(state.get("request", {}).get("model_path")))
        release.wait(60)
        return {"status": "failed", "reason": "released"}

    def build() -> StateGraph[Any]:
        g: StateGraph[Any] = StateGraph(PortState)
        g.add_node("executor", node)
        g.add_edge(START, "executor")
        g.add_edge("executor", END)
        return g

    return build


def _app(home: Path, roots: Path, builder: Any, **over: Any) -> TestClient:
    return TestClient(create_app(make_settings(home, roots, tokens=TOKENS, **over), graph_builder=builder))


def test_one_owner_cannot_fill_the_queue_or_take_every_worker(service_home: Path, service_roots: Path) -> None:
    in_process_only("the shares are the service's settings")
    release, started = threading.Event(), []
    with _app(service_home, service_roots, _waiting_builder(release, started), workers=2,
              max_queued_per_owner=2, max_running_per_owner=1) as c:
        try:
            codes = [c.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=A).status_code
                     for _ in range(4)]
            time.sleep(1.5)
            # A: one running (its share of the workers), two waiting (its share of the queue), the fourth refused
            assert codes[:3] == [201, 201, 201] and codes[3] == 429, codes
            running = [j for j in c.get("/v1/ports", headers=A).json() if j["status"] == "running"]
            assert len(running) == 1, [j["status"] for j in c.get("/v1/ports", headers=A).json()]
            # B is served at once: the second worker was A's to take, but not its share
            rb = c.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=B)
            assert rb.status_code == 201
            _wait(c, f"/v1/ports/{rb.json()['id']}", B, ("running",), timeout=30)
        finally:
            release.set()


def test_one_owners_uploads_cannot_fill_the_disk(service_home: Path, service_roots: Path) -> None:
    """Two 0.5 MiB uploads once kept 1000 MiB: the uploads of a token's unfinished jobs hold at most its share."""
    in_process_only("the shares are the service's settings")
    release, started = threading.Event(), []
    with _app(service_home, service_roots, _waiting_builder(release, started), owner_upload_mb=1,
              max_extracted_bytes=900 * 1024, max_upload_bytes=256 * 1024) as c:
        try:
            first = c.post("/v1/ports", files={"archive": ("m.zip", _zip(700 * 1024), "application/zip")},
                           data={"request": json.dumps({"target": "cpu"})}, headers=A)
            assert first.status_code == 201, first.text
            second = c.post("/v1/ports", files={"archive": ("m.zip", _zip(700 * 1024), "application/zip")},
                            data={"request": json.dumps({"target": "cpu"})}, headers=A)
            assert second.status_code == 413, second.text
            other = c.post("/v1/ports", files={"archive": ("m.zip", _zip(700 * 1024), "application/zip")},
                           data={"request": json.dumps({"target": "cpu"})}, headers=B)
            assert other.status_code == 201, other.text  # B's share is its own
        finally:
            release.set()


def test_a_service_that_cannot_cap_memory_refuses_ports(service_home: Path, service_roots: Path,
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    in_process_only("the host's cgroups are the server's")
    import sandbox.isolation.cgroups as cgroups

    monkeypatch.setattr(cgroups, "CGROUP_FS", tmp_path / "no-cgroups")  # a host without a writable memory cgroup
    release, started = threading.Event(), []
    release.set()
    with _app(service_home, service_roots, _waiting_builder(release, started)) as c:
        r = c.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=A)
        job = _wait(c, f"/v1/ports/{r.json()['id']}", A, ("failed", "validated"), timeout=30)
        assert job["status"] == "failed" and "memory" in job["reason"] and not started, job
        batch = c.post("/v1/batches", json={"manifest": {"name": "b", "models": [{"path": "m1"}]}}, headers=A)
        assert batch.status_code == 503, batch.text


# --- a run's memory, as a whole ------------------------------------------------------------------------------

HOG = ("import subprocess, sys\n"
       "ps = [subprocess.Popen([sys.executable, '-c', 'b = bytearray(300 * 2**20); import time; time.sleep(3)'])"
       " for _ in range(3)]\n"
       "print('exits', [p.wait() for p in ps])\n")


def test_a_runs_memory_is_capped_as_a_whole(box: Sandbox, tmp_path: Path) -> None:
    """Three processes of 300 MiB each stay under a per-process cap of 16 GiB; the run's cap (512 MiB here) holds
    them all: the kernel kills what goes beyond, and the run says so."""
    from sandbox.isolation.cgroups import memory_capped

    if not memory_capped():
        pytest.skip("no writable memory cgroup here (a normal user without NPUPORT_CGROUP_PARENT)")
    res = box.execute([sys.executable, "-c", HOG], cwd=tmp_path, env=scrubbed_env(),
                      limits=Limits(**{"wall_s": 60, "memory_mb": 512}))
    assert "exits [0, 0, 0]" not in res.stdout, res.stdout
    assert any("memory cap" in n for n in res.notes), res.notes


def test_a_runs_tmpfs_counts_in_its_memory(box: Sandbox, tmp_path: Path) -> None:
    """1 GiB written to the run's private /tmp (a tmpfs: host RAM) once escaped every limit; its pages count in
    the run's memory cgroup."""
    needs_isolation(box)
    from sandbox.isolation.cgroups import memory_capped

    if not memory_capped():
        pytest.skip("no writable memory cgroup here (a normal user without NPUPORT_CGROUP_PARENT)")
    code = ("f = open('/tmp/big', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * 2**20)\n"
            "f.close()\nprint('wrote 1 GiB')\n")
    res = box.execute([sys.executable, "-c", code], cwd=tmp_path, env=scrubbed_env(),
                      limits=Limits(**{"wall_s": 60, "memory_mb": 512, "tmpfs_mb": 2048}))
    assert "wrote 1 GiB" not in res.stdout and any("memory cap" in n for n in res.notes), (res.stdout, res.notes)


def test_a_ports_workspace_has_a_disk_quota(box: Sandbox, tmp_path: Path) -> None:
    """Each run folder is capped while it runs; their sum (the port's workspace) is capped too: runs that each
    stay under their own quota cannot fill the disk together. No run starts once the workspace is over it."""
    import yaml

    from agents.workspace import Workspace
    from sandbox.harness.runner import run_harness
    from sandbox.targets import Target

    original = write_model(tmp_path / "m", in_generate="open('fill.bin', 'wb').write(b'x' * (30 * 2**20))")
    ws = Workspace.create(original, tmp_path / "work")
    manifest = yaml.safe_load((ws.model_dir / "npuport.yaml").read_text())
    limits = Limits(**{"wall_s": 60, "folder_quota_mb": 100, "workspace_quota_mb": 45})
    results = [run_harness(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / f"run-{i}",
                           manifest=manifest, target=Target("cpu", "cpu"), sandbox=box, limits=limits)
               for i in range(3)]
    assert [r.ok for r in results[:2]] == [True, True], [r.result.get("exception") for r in results]
    assert not results[2].ok and (results[2].result.get("exception") or {}).get("type") == "WorkspaceQuota"
    assert not (ws.runs_dir / "run-2" / "fill.bin").exists()  # the third never ran
