"""The HTTP service: auth, jobs, SSE resume, bundle, approve/cancel, idempotency, bad input.

These tests are about the API itself, so their jobs run a stand-in graph (tests/test_api_helpers.py:
five quick nodes with the real state schema, the real SQLite checkpointer and the real job
manager). The real port graph is exercised by the slow tests (crash/resume, chat, web, langgraph dev).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_api_helpers import fake_builder, sse_events, tar_bytes, tiny_model_files, zip_bytes

from api.app import create_app
from knowledge.settings import ServiceSettings as Settings

RW = {"Authorization": "Bearer tok-rw"}
RO = {"Authorization": "Bearer tok-ro"}


@pytest.fixture()
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    (root / "m1" / "npuport.yaml").write_text("name: m1\n")
    return root


def make_settings(home: Path, roots: Path, **over: Any) -> Settings:
    base: dict[str, Any] = {"home": home, "tokens": {"tok-rw": ["read", "write"], "tok-ro": ["read", "admin"]},
                            "allowed_roots": [roots], "workers": 2, "body_timeout_s": 1.0,
                            "max_body_bytes": 64 * 1024, "max_upload_bytes": 256 * 1024,
                            "max_extracted_bytes": 512 * 1024}
    base.update(over)
    return Settings(**base)


@pytest.fixture()
def client(npuport_home: Path, roots: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(npuport_home, roots), graph_builder=fake_builder)) as c:
        yield c


def wait_status(c: TestClient, job_id: str, statuses: set[str], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = c.get(f"/v1/ports/{job_id}", headers=RO).json()
        if job["status"] in statuses:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never reached {statuses}: {job}")


def submit(c: TestClient, **body: Any) -> dict[str, Any]:
    r = c.post("/v1/ports", json=body or {"request": {"model_path": "m1", "target": "cpu"}}, headers=RW)
    assert r.status_code == 201, r.text
    return r.json()


# --- auth -------------------------------------------------------------------------------------

ROUTES = [("GET", "/v1/ports"), ("POST", "/v1/ports"), ("GET", "/v1/ports/x"), ("GET", "/v1/ports/x/events"),
          ("GET", "/v1/ports/x/bundle"), ("GET", "/v1/ports/x/report"), ("POST", "/v1/ports/x/approve"),
          ("POST", "/v1/ports/x/cancel"), ("POST", "/v1/chat/completions")]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_but_health_needs_a_valid_token(client: TestClient, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dG9rLXJ3Og=="}):
        r = client.request(method, path, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/ports"), ("POST", "/v1/ports/x/approve"),
                                              ("POST", "/v1/ports/x/cancel")])
def test_read_only_token_cannot_write(client: TestClient, method: str, path: str) -> None:
    r = client.request(method, path, headers=RO, json={"request": {"model_path": "m1"}})
    assert r.status_code == 403
    assert "write" in r.json()["detail"]


def test_read_only_token_cannot_start_a_port_in_chat_but_may_chat(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", headers=RO,
                    json={"model": "npuport", "messages": [{"role": "user", "content": "port the model in m1"}]})
    assert r.status_code == 403
    r = client.post("/v1/chat/completions", headers=RO, json={"messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200 and "port" in r.json()["choices"][0]["message"]["content"]


def test_health_page_and_docs_are_open(client: TestClient) -> None:
    assert client.get("/healthz").json()["ok"] is True
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"] and "npuport" in page.text
    schema = client.get("/openapi.json").json()
    assert {"/v1/ports", "/v1/ports/{job_id}/events", "/v1/chat/completions", "/healthz"} <= set(schema["paths"])
    assert client.get("/docs").status_code == 200


def test_no_tokens_configured_means_closed(npuport_home: Path, roots: Path) -> None:
    with TestClient(create_app(make_settings(npuport_home, roots, tokens={}))) as c:
        assert c.get("/v1/ports", headers=RW).status_code == 401
        assert c.get("/healthz").status_code == 200


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NPUPORT_TOKENS", '{"a": ["read"], "b": ["read", "write"]}')
    monkeypatch.setenv("NPUPORT_ALLOWED_ROOTS", f"{tmp_path}{os.pathsep}/srv/models")
    monkeypatch.setenv("NPUPORT_WORKERS", "3")
    s = Settings()
    assert s.tokens == {"a": ["read"], "b": ["read", "write"]}
    assert s.allowed_roots == [tmp_path, Path("/srv/models")] and s.workers == 3
    monkeypatch.setenv("NPUPORT_TOKENS", "x=read+write,y=read")
    assert Settings().tokens == {"x": ["read", "write"], "y": ["read"]}
    monkeypatch.setenv("NPUPORT_TOKENS", '{"a": ["root"]}')
    with pytest.raises(ValueError, match="unknown scopes"):
        Settings()


# --- jobs, events, bundle ------------------------------------------------------------------------

def test_job_runs_and_events_resume_with_last_event_id(client: TestClient, npuport_home: Path) -> None:
    job = submit(client, goal="port the model in m1 to Ascend 910B on the cpu")
    assert job["request"]["model_path"].endswith("/m1") and job["request"]["target"] == "cpu"
    assert job["request"]["out_dir"].startswith(str(npuport_home))  # the server picks where bundles go
    events = list(sse_events(client, f"/v1/ports/{job['id']}/events", RO))
    assert events[-1]["event"] == "end" and json.loads(events[-1]["data"])["status"] == "validated"
    body = [e for e in events if "id" in e]
    assert [int(e["id"]) for e in body] == list(range(1, len(body) + 1))
    steps = [json.loads(e["data"])["data"] for e in body if e["event"] == "step"]
    assert [s["agent"] for s in steps] == ["planner", "code_reader", "patcher", "executor", "reporter"]
    assert [s["step"] for s in steps] == list(range(5))
    # resume after event 3: exactly the rest, same ids and payloads
    rest = [e for e in sse_events(client, f"/v1/ports/{job['id']}/events", {**RO, "Last-Event-ID": "3"}) if "id" in e]
    assert rest == body[3:]
    assert [e["seq"] for e in client.get(f"/v1/ports/{job['id']}/events?stream=false&after=3", headers=RO).json()] == \
        [int(e["id"]) for e in body[3:]]
    final = client.get(f"/v1/ports/{job['id']}", headers=RO).json()
    assert final["status"] == "validated" and final["steps"] == 5 and final["bundle_url"]


def test_bundle_zip_and_report(client: TestClient) -> None:
    job = submit(client)
    r = client.get(f"/v1/ports/{job['id']}/bundle", headers=RO)
    assert r.status_code in (200, 409)
    wait_status(client, job["id"], {"validated"})
    r = client.get(f"/v1/ports/{job['id']}/bundle", headers=RO)
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        assert {"port.patch", "report.md", "report.json"} <= set(zf.namelist())
        assert json.loads(zf.read("report.json"))["status"] == "validated"
    rep = client.get(f"/v1/ports/{job['id']}/report", headers=RO).json()
    assert rep["json"]["status"] == "validated" and rep["markdown"].startswith("# npuport report")


def test_live_stream_sees_steps_before_the_end(npuport_home: Path, roots: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.3")
    with TestClient(create_app(make_settings(npuport_home, roots), graph_builder=fake_builder)) as c:
        job = submit(c)
        first_step_at, end_at = None, None
        for ev in sse_events(c, f"/v1/ports/{job['id']}/events", RO):
            if ev.get("event") == "step" and first_step_at is None:
                first_step_at = time.time()
            if ev.get("event") == "end":
                end_at = time.time()
        assert first_step_at is not None and end_at is not None
        assert end_at - first_step_at > 0.6  # steps arrived while the job ran, not all at the end


def test_approval_gate(client: TestClient) -> None:
    job = submit(client, request={"model_path": "m1", "target": "cpu"}, require_approval=True)
    waiting = wait_status(client, job["id"], {"awaiting_approval"})
    steps = client.get(f"/v1/ports/{job['id']}/events?stream=false", headers=RO).json()
    assert [e["data"]["agent"] for e in steps if e["kind"] == "step"] == ["planner", "code_reader"]
    assert waiting["status"] == "awaiting_approval"
    assert client.post(f"/v1/ports/{job['id']}/approve", headers=RW).status_code == 200
    done = wait_status(client, job["id"], {"validated", "failed"})
    assert done["status"] == "validated" and done["steps"] == 5
    assert client.post(f"/v1/ports/{job['id']}/approve", headers=RW).status_code == 409


def test_cancel_running_job(npuport_home: Path, roots: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.5")
    with TestClient(create_app(make_settings(npuport_home, roots), graph_builder=fake_builder)) as c:
        job = submit(c)
        wait_status(c, job["id"], {"running"})
        r = c.post(f"/v1/ports/{job['id']}/cancel", headers=RW)
        assert r.status_code == 200
        done = wait_status(c, job["id"], {"cancelled", "validated"})
        assert done["status"] == "cancelled" and done["steps"] < 5
        assert c.post(f"/v1/ports/{job['id']}/cancel", headers=RW).status_code == 409


def test_worker_pool_is_bounded(npuport_home: Path, roots: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.2")
    with TestClient(create_app(make_settings(npuport_home, roots, workers=1), graph_builder=fake_builder)) as c:
        a, b = submit(c), submit(c)
        wait_status(c, a["id"], {"running"})
        assert c.get(f"/v1/ports/{b['id']}", headers=RO).json()["status"] == "queued"
        # cancelling a queued job never runs it
        assert c.post(f"/v1/ports/{b['id']}/cancel", headers=RW).json()["status"] == "cancelled"
        wait_status(c, a["id"], {"validated"})
        assert c.get(f"/v1/ports/{b['id']}", headers=RO).json()["steps"] == 0


def test_restart_in_process_resumes_queued_and_running_jobs(npuport_home: Path, roots: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.4")
    settings = make_settings(npuport_home, roots, workers=1)
    with TestClient(create_app(settings, graph_builder=fake_builder)) as c:
        a, b = submit(c), submit(c)
        deadline = time.time() + 20
        while c.get(f"/v1/ports/{a['id']}", headers=RO).json()["steps"] < 2 and time.time() < deadline:
            time.sleep(0.05)
    # the app shut down gracefully mid-job: a stays "running" (resumable), b "queued"
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.01")
    with TestClient(create_app(settings, graph_builder=fake_builder)) as c:
        for j in (a, b):
            done = wait_status(c, j["id"], {"validated", "failed", "cancelled"})
            assert done["status"] == "validated"
            steps = [e["data"] for e in c.get(f"/v1/ports/{j['id']}/events?stream=false", headers=RO).json()
                     if e["kind"] == "step"]
            assert [s["agent"] for s in steps] == ["planner", "code_reader", "patcher", "executor", "reporter"]


# --- idempotency and bad input -------------------------------------------------------------------

def test_idempotency_key(client: TestClient) -> None:
    body = {"request": {"model_path": "m1", "target": "cpu"}}
    h = {**RW, "Idempotency-Key": "abc-1"}
    first = client.post("/v1/ports", json=body, headers=h)
    again = client.post("/v1/ports", json=body, headers=h)
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
    other = client.post("/v1/ports", json={"request": {"model_path": "m1", "target": "ascend-sim"}}, headers=h)
    assert other.status_code == 409 and first.json()["id"] in other.json()["detail"]
    assert len(client.get("/v1/ports", headers=RO).json()) == 1


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{not json", 400, "malformed JSON"),
    (b"[1, 2]", 422, "JSON object"),
    (b'{"goal": 5}', 422, "string"),
    (b"{}", 422, "give a goal"),
    (b'{"request": {"model_path": "m1", "target": "tpu"}}', 422, "target"),
    (b'{"request": {"model_path": "m1", "out_dir": "/etc"}}', 422, "out_dir"),
    (b'{"goal": "make it fast"}', 422, "names no model"),
])
def test_bad_bodies_get_clear_4xx(client: TestClient, body: bytes, status: int, needle: str) -> None:
    r = client.post("/v1/ports", content=body, headers={**RW, "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in json.dumps(r.json())


def test_unknown_ids_are_404(client: TestClient) -> None:
    for method, path in [("GET", "/v1/ports/nope"), ("GET", "/v1/ports/nope/events"), ("GET", "/v1/ports/nope/bundle"),
                         ("GET", "/v1/ports/nope/report"), ("POST", "/v1/ports/nope/approve"),
                         ("POST", "/v1/ports/nope/cancel")]:
        r = client.request(method, path, headers=RW)
        assert r.status_code == 404 and "nope" in r.json()["detail"], (path, r.text)


def test_bad_last_event_id(client: TestClient) -> None:
    job = submit(client)
    assert client.get(f"/v1/ports/{job['id']}/events", headers={**RO, "Last-Event-ID": "x"}).status_code == 400


def test_oversized_bodies_are_413(client: TestClient) -> None:
    big = json.dumps({"goal": "port the model in m1", "pad": "x" * 70_000}).encode()
    r = client.post("/v1/ports", content=big, headers={**RW, "Content-Type": "application/json"})
    assert r.status_code == 413
    # without Content-Length (chunked): the cap is enforced while reading

    def chunks() -> Iterator[bytes]:
        yield b'{"goal": "'
        for _ in range(20):
            yield b"y" * 8192
        yield b'"}'

    r = client.post("/v1/ports", content=chunks(), headers={**RW, "Content-Type": "application/json"})
    assert r.status_code == 413


@contextlib.contextmanager
def live_server(home: Path, roots: Path) -> Iterator[int]:
    """The app under a real uvicorn on a free port (timeouts and streaming need real sockets)."""
    import uvicorn
    from test_api_helpers import free_port, wait_http

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(make_settings(home, roots), graph_builder=fake_builder),
                                           host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        yield port
    finally:
        server.should_exit = True
        t.join(10)


def test_slow_client_gets_408_and_the_server_keeps_serving(npuport_home: Path, roots: Path) -> None:
    with live_server(npuport_home, roots) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/ports HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-rw\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"goal\": ")
        import httpx

        t0 = time.time()
        # while this client stalls, others are served
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        reply = s.recv(4096).decode()
        assert reply.startswith("HTTP/1.1 408"), reply
        assert "no request body data" in reply
        assert time.time() - t0 < 8


def test_event_stream_outlives_the_body_timeout(npuport_home: Path, roots: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An SSE stream (a GET with no body) stays open far longer than the body-stall timeout: the
    timeout is for bodies, not for responses that stream (regression: streams were cut at 1 s)."""
    import httpx

    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.6")  # five steps: ~3 s of streaming, body timeout 1 s
    with live_server(npuport_home, roots) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            job = c.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=RW).json()
            start = time.time()
            events = list(sse_events(c, f"/v1/ports/{job['id']}/events", RO, limit_s=60))
        assert time.time() - start > 2.0
        kinds = [e.get("event") for e in events]
        assert kinds.count("step") >= 5 and kinds[-1] == "end", kinds


# --- model roots and uploads -----------------------------------------------------------------

def test_model_paths_confined_to_roots(client: TestClient, roots: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret_model"
    outside.mkdir()
    (roots / "sneaky").symlink_to(outside, target_is_directory=True)
    (roots / "afile").write_text("x")
    cases = [(str(outside), 403), ("sneaky", 403), ("../secret_model", 403), ("m1/../../secret_model", 403),
             ("/etc", 403), ("missing", 400), ("afile", 400), (str(roots / "m1"), 201), ("m1", 201)]
    for path, status in cases:
        r = client.post("/v1/ports", json={"request": {"model_path": path, "target": "cpu"}}, headers=RW)
        assert r.status_code == status, (path, r.text)


def upload(c: TestClient, data: bytes, name: str = "m.zip", **fields: str) -> Any:
    return c.post("/v1/ports", files={"archive": (name, data, "application/octet-stream")},
                  data={"request": json.dumps({"target": "cpu"}), **fields}, headers=RW)


def test_upload_zip_and_tar_gz(client: TestClient, npuport_home: Path) -> None:
    for data, name in ((zip_bytes(tiny_model_files()), "m.zip"), (tar_bytes(tiny_model_files()), "m.tar.gz")):
        r = upload(client, data, name)
        assert r.status_code == 201, r.text
        model = Path(r.json()["request"]["model_path"])
        assert model.name == "tiny" and model.is_relative_to(npuport_home / "uploads")
        assert (model / "npuport.yaml").is_file()
        wait_status(client, r.json()["id"], {"validated"})


@pytest.mark.parametrize(("archive", "status", "needle"), [
    (zip_bytes({"../evil.py": b"x"}), 400, "traversal"),
    (zip_bytes({"/etc/evil.py": b"x"}), 400, "absolute"),
    (zip_bytes({"a/../../evil.py": b"x"}), 400, "traversal"),
    (zip_bytes({"m/a.py": b"x"}, symlinks={"m/link": "../../../etc/passwd"}), 400, "escapes"),
    (zip_bytes({"m/a.py": b"x"}, symlinks={"m/link": "/etc/passwd"}), 400, "absolute"),
    (tar_bytes({"m/a.py": b"x"}, links={"m/link": ("../../etc", tarfile.SYMTYPE)}), 400, "escapes"),
    (tar_bytes({"m/a.py": b"x"}, links={"m/hard": ("/etc/passwd", tarfile.LNKTYPE)}), 400, "absolute"),
    (tar_bytes({"../../x.py": b"x"}), 400, "traversal"),
    (zip_bytes({"m/big.bin": b"\0" * 600_000}), 413, "unpacks to more than"),
    (b"this is not an archive", 400, "not a zip or tar"),
], ids=["zip-parent", "zip-absolute", "zip-inner-parent", "zip-symlink-escapes", "zip-symlink-absolute",
        "tar-symlink-escapes", "tar-hardlink-absolute", "tar-parent", "zip-bomb", "not-an-archive"])
def test_bad_archives_rejected(client: TestClient, npuport_home: Path, archive: bytes, status: int,
                               needle: str) -> None:
    r = upload(client, archive)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    uploads = npuport_home / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())  # nothing is left behind
    assert not (npuport_home.parent / "evil.py").exists()


def test_internal_symlink_in_archive_is_fine(client: TestClient) -> None:
    files = tiny_model_files()
    r = upload(client, zip_bytes(files, symlinks={"tiny/alias.py": "m.py"}))
    assert r.status_code == 201, r.text
    assert (Path(r.json()["request"]["model_path"]) / "alias.py").resolve().name == "m.py"


def test_upload_size_cap(client: TestClient) -> None:
    r = upload(client, os.urandom(300 * 1024))
    assert r.status_code == 413


def test_upload_idempotency_includes_the_archive(client: TestClient) -> None:
    a = zip_bytes(tiny_model_files())
    h = {**RW, "Idempotency-Key": "up-1"}
    files = {"archive": ("m.zip", a, "application/zip")}
    r1 = client.post("/v1/ports", files=files, data={"request": '{"target": "cpu"}'}, headers=h)
    r2 = client.post("/v1/ports", files=files, data={"request": '{"target": "cpu"}'}, headers=h)
    assert (r1.status_code, r2.status_code) == (201, 200) and r1.json()["id"] == r2.json()["id"]
    other = zip_bytes({**tiny_model_files(), "tiny/extra.py": b"y = 1\n"})
    r3 = client.post("/v1/ports", files={"archive": ("m.zip", other, "application/zip")},
                     data={"request": '{"target": "cpu"}'}, headers=h)
    assert r3.status_code == 409


def test_concurrent_approvals_run_the_job_once(client: TestClient) -> None:
    job = submit(client, request={"model_path": "m1", "target": "cpu"}, require_approval=True)
    wait_status(client, job["id"], {"awaiting_approval"})
    codes: list[int] = []
    barrier = threading.Barrier(6)

    def approve() -> None:
        barrier.wait()
        codes.append(client.post(f"/v1/ports/{job['id']}/approve", headers=RW).status_code)

    threads = [threading.Thread(target=approve) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200] + [409] * 5  # one approval wins the status transition
    done = wait_status(client, job["id"], {"validated", "failed"})
    assert done["status"] == "validated" and done["steps"] == 5  # the graph ran once, not six times


def test_cancel_racing_the_start_never_runs_the_job(npuport_home: Path, roots: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.2")
    with TestClient(create_app(make_settings(npuport_home, roots, workers=1), graph_builder=fake_builder)) as c:
        a, b = submit(c), submit(c)
        wait_status(c, a["id"], {"running"})
        codes: list[int] = []
        threads = [threading.Thread(target=lambda: codes.append(
            c.post(f"/v1/ports/{b['id']}/cancel", headers=RW).status_code)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(codes) == [200] + [409] * 3  # the first cancel ends it; the rest find it ended
        wait_status(c, a["id"], {"validated"})
        final = c.get(f"/v1/ports/{b['id']}", headers=RO).json()
        assert final["status"] == "cancelled" and final["steps"] == 0
