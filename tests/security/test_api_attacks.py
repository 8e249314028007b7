"""Classes: owners, uploads and service faults, attacked through the HTTP API (real app, httpx.Client)."""

from __future__ import annotations

import io
import json
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_api_helpers import tiny_model_files

from agents.workspace import Workspace, tree_digest
from knowledge.errors import WorkspaceError

from .conftest import SERVE_TOKENS, api_client, in_process_only, live_server, write_model

A = {"Authorization": "Bearer tok-a"}
B = {"Authorization": "Bearer tok-b"}
ADMIN = {"Authorization": "Bearer tok-admin"}


@pytest.fixture()
def roots(service_roots: Path) -> Path:
    return service_roots


@pytest.fixture()
def npuport_home(service_home: Path) -> Path:
    return service_home


@pytest.fixture()
def client(npuport_home: Path, roots: Path) -> Iterator[httpx.Client]:
    """The service: a live `npuport serve` over HTTP (bench/security.py --serve), else the app in-process."""
    with api_client(npuport_home, roots, SERVE_TOKENS) as c:
        yield c


# --- owners -----------------------------------------------------------------------------------------

def test_jobs_belong_to_their_token(client: httpx.Client) -> None:
    r = client.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}, "require_approval": True},
                    headers=A)
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    for method, path in (("GET", f"/v1/ports/{job}"), ("GET", f"/v1/ports/{job}/events?stream=false"),
                         ("GET", f"/v1/ports/{job}/report"), ("GET", f"/v1/ports/{job}/bundle"),
                         ("POST", f"/v1/ports/{job}/approve"), ("POST", f"/v1/ports/{job}/cancel")):
        assert client.request(method, path, headers=B).status_code == 404, (method, path)
    assert job not in [j["id"] for j in client.get("/v1/ports", headers=B).json()]
    assert job in [j["id"] for j in client.get("/v1/ports", headers=A).json()]
    assert job in [j["id"] for j in client.get("/v1/ports", headers=ADMIN).json()]
    assert client.get(f"/v1/ports/{job}", headers=ADMIN).status_code == 200
    assert client.get(f"/v1/ports/{job}", headers=A).json()["status"] != "cancelled"  # B's cancel did nothing
    assert client.post(f"/v1/ports/{job}/cancel", headers=ADMIN).status_code in (200, 409)


# --- uploads ------------------------------------------------------------------------------------------

def _zip(members: list[tuple[str, str, str]]) -> bytes:
    """(name, kind, data-or-link) in the order given."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, kind, data in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = ((stat.S_IFLNK | 0o777) if kind == "symlink" else (stat.S_IFREG | 0o644)) << 16
            zf.writestr(info, data)
    return buf.getvalue()


def _upload(c: httpx.Client, data: bytes) -> tuple[int, str]:
    r = c.post("/v1/ports", files={"archive": ("m.zip", data, "application/zip")},
               data={"request": json.dumps({"target": "cpu"})}, headers=A)
    return r.status_code, r.text


def _left(home: Path) -> list[Path]:
    up = home / "uploads"
    return [p for p in up.rglob("*") if p.is_file() or p.is_symlink()] if up.exists() else []


def _model_members() -> list[tuple[str, str, str]]:
    files = tiny_model_files()
    return [(f"tiny/{n}", "file", d if isinstance(d, str) else d.decode()) for n, d in files.items()]


@pytest.mark.parametrize("chain", [
    # each link is harmless on its own; together they carry the last member out of the folder
    [("d1", "symlink", "."), ("d1/d2", "symlink", ".."), ("d1/d2/escaped.txt", "file", "pwned")],
    [("d1/d2/escaped.txt", "file", "pwned"), ("d1", "symlink", "."), ("d1/d2", "symlink", "..")],
    [("a", "symlink", "b/.."), ("b", "symlink", "."), ("a/escaped.txt", "file", "pwned")],
    [("up", "symlink", "sub/../.."), ("up/escaped.txt", "file", "pwned")],
])
def test_symlink_chains_never_write_outside(client: httpx.Client, npuport_home: Path, tmp_path: Path,
                                            chain: list[tuple[str, str, str]]) -> None:
    status, text = _upload(client, _zip([*_model_members(), *chain]))
    assert status == 400, text
    live = live_server()
    assert not list((live[1].parent if live else tmp_path).rglob("escaped.txt"))
    assert not _left(npuport_home), "the failed upload left files behind"


def test_dangling_symlink_is_400_and_cleaned(client: httpx.Client, npuport_home: Path) -> None:
    status, text = _upload(client, _zip([*_model_members(), ("tiny/weights.bin", "symlink", "nowhere/at/all")]))
    assert status == 400, text
    assert not _left(npuport_home)


def test_chunked_oversized_upload_is_413(client: httpx.Client) -> None:
    boundary = "npuportboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"archive\"; filename=\"m.zip\"\r\n"
            "Content-Type: application/zip\r\n\r\n").encode()

    def body() -> Iterator[bytes]:  # no Content-Length: the server only learns the size by reading
        yield head
        for _ in range(64):
            yield b"0" * (16 * 1024)
        yield f"\r\n--{boundary}--\r\n".encode()

    r = client.post("/v1/ports", content=body(),
                    headers={**A, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413, r.text


def test_model_folder_symlinks_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "server-secret.txt"
    secret.write_text("sk-live-secret")
    for name, target in (("key.txt", secret), ("loop", Path(".")), ("gone.txt", tmp_path / "missing")):
        model = write_model(tmp_path / f"model-{name}")
        (model / name).symlink_to(target)
        before = tree_digest(model)
        with pytest.raises(WorkspaceError, match="symlink"):
            Workspace.create(model, tmp_path / f"work-{name}")
        assert tree_digest(model) == before
    inside = write_model(tmp_path / "model-inside")
    (inside / "alias.json").symlink_to(inside / "config.json")
    ws = Workspace.create(inside, tmp_path / "work-inside")
    assert (ws.model_dir / "alias.json").read_text() == (inside / "config.json").read_text()


# --- service faults ---------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    '{"request": {"model_path": "m1", "target": "cpu", "run_timeout_s": Infinity}}',
    '{"request": {"model_path": "m1", "target": "cpu", "run_timeout_s": NaN}}',
    '{"request": {"model_path": "m1", "target": "cpu", "run_timeout_s": 1e300}}',
    '{"request": {"model_path": "m1", "target": "cpu", "max_runs": 1' + "0" * 400 + "}}",
    '{"goal": ' + "[" * 20000 + "]" * 20000 + "}",
    '{"goal": "x", "request": ' + '{"a":' * 100 + "1" + "}" * 100 + "}",
])
def test_bad_numbers_and_deep_json_are_422(client: httpx.Client, raw: str) -> None:
    r = client.post("/v1/ports", content=raw, headers={**A, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text


def test_reconnecting_sse_client_always_gets_the_terminal_event(client: httpx.Client) -> None:
    """The race behind "missed the terminal event": the job row is terminal, its terminal event not yet
    written, and a client reconnects with Last-Event-ID. The stream must wait for the event."""
    import threading
    import time

    from test_api_helpers import sse_events

    in_process_only("it recreates a race inside the server's job store")
    mgr = client.app.state.manager  # type: ignore[attr-defined]
    job = client.post("/v1/ports", json={"request": {"model_path": "m1", "target": "cpu"}}, headers=A).json()["id"]
    deadline = time.monotonic() + 60
    while (final := client.get(f"/v1/ports/{job}", headers=A).json())["status"] not in (
            "validated", "not_validated", "failed") and time.monotonic() < deadline:
        time.sleep(0.05)
    events = mgr.store.events(job, after=0, limit=100_000)
    terminal = next(e for e in events if e.kind == "status" and e.data.get("status") == final["status"])
    with mgr.store._lock:  # recreate the moment between the row update and the event insert
        mgr.store._conn.execute("DELETE FROM events WHERE job_id=? AND seq>=?", (job, terminal.seq))
    last = max(e.seq for e in events if e.seq < terminal.seq)
    threading.Timer(0.5, lambda: mgr._event(job, "status", terminal.data)).start()
    start = time.monotonic()
    got = list(sse_events(client, f"/v1/ports/{job}/events", {**A, "Last-Event-ID": str(last)}, limit_s=30))
    kinds = [(e.get("event"), json.loads(e["data"]).get("data", {}).get("status") if e.get("event") == "status"
              else None) for e in got]
    assert ("status", final["status"]) in kinds, kinds
    assert kinds[-1][0] == "end" and time.monotonic() - start < 15
