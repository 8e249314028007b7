"""Helpers for the API tests (no tests here).

``fake_builder`` is a stand-in port graph, used only by tests about the API itself (auth, SSE,
idempotency, cancel, approval, restart bookkeeping): five quick nodes with the real state schema
that write a small bundle. Tests that claim a real port use the real graph (marked slow).

Run as a script it serves the app on loopback, with the fake graph if asked:
``python tests/test_api_helpers.py --port 8123 [--fake]`` (settings from NPUPORT_* env).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from langgraph.graph import END, START, StateGraph  # noqa: E402

from agents.trace import step  # noqa: E402
from graph.state import PortState  # noqa: E402

FAKE_NODES = ("planner", "code_reader", "patcher", "executor", "reporter")


def _fake_node(name: str) -> Any:
    def node(state: dict[str, Any]) -> dict[str, Any]:
        delay = float(os.environ.get("NPUPORT_FAKE_STEP_S", "0.05"))
        home = Path(os.environ["NPUPORT_HOME"])
        # every execution is logged, so a test can tell a step that ran twice from one that ran once
        with open(home / "fake-executions.log", "a") as fh:
            fh.write(f"{name}\n")
        time.sleep(delay)
        out: dict[str, Any] = {"trace": [step(name, f"{name} did its part")]}
        if name == "planner":
            out["status"] = "running"
        if name == "reporter":
            bundle = Path(state["request"]["out_dir"])
            bundle.mkdir(parents=True, exist_ok=True)
            (bundle / "port.patch").write_text("--- a/m.py\n+++ b/m.py\n@@\n-x = 1\n+x = 2\n")
            (bundle / "report.md").write_text("# npuport report: fake\n\n- **Status:** validated — fake graph\n")
            (bundle / "report.json").write_text(json.dumps({"status": "validated", "reason": "fake graph"}))
            out.update(status="validated", reason="fake graph",
                       bundle={"dir": str(bundle), "files": {"report_md": str(bundle / "report.md")}})
        return out

    return node


def fake_builder() -> StateGraph[Any]:
    g: StateGraph[Any] = StateGraph(PortState)
    for n in FAKE_NODES:
        g.add_node(n, _fake_node(n))
    g.add_edge(START, FAKE_NODES[0])
    for a, b in zip(FAKE_NODES, FAKE_NODES[1:], strict=False):
        g.add_edge(a, b)
    g.add_edge(FAKE_NODES[-1], END)
    return g


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen[Any] | None = None) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def start_server(port: int, env: dict[str, str], fake: bool, log: Path) -> subprocess.Popen[Any]:
    """A server subprocess on loopback (the real app; the fake graph only with ``fake``)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port)] + (["--fake"] if fake else [])
    fh = open(log, "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
    return proc


def sse_events(client: Any, url: str, headers: dict[str, str], limit_s: float = 120.0) -> Iterator[dict[str, Any]]:
    """Parse a text/event-stream response into {"id", "event", "data"} dicts."""
    with client.stream("GET", url, headers=headers, timeout=limit_s) as r:
        assert r.status_code == 200, r.read()
        ev: dict[str, Any] = {}
        for line in r.iter_lines():
            if not line:
                if ev:
                    yield ev
                ev = {}
                continue
            if line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            ev[key] = ev.get(key, "") + value if key == "data" else value


def zip_bytes(files: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, target)
    return buf.getvalue()


def tar_bytes(files: dict[str, bytes], links: dict[str, tuple[str, bytes]] | None = None) -> bytes:
    """``links``: name -> (target, tar type byte: tarfile.SYMTYPE or LNKTYPE)."""
    buf = io.BytesIO()
    # gzip's header holds a time: mtime=0 makes the bytes (and a test id made of them) the same on every worker
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, (target, kind) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def tiny_model_files() -> dict[str, bytes]:
    """A minimal model folder with a manifest (for upload tests; the fake graph never runs it)."""
    return {
        "tiny/npuport.yaml": b"name: tiny\nentry: {class: m:Tiny}\nconfig: config.json\ninputs: m:make_inputs\n",
        "tiny/config.json": b"{}",
        "tiny/m.py": b"class Tiny:\n    pass\n",
    }


def _serve() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fake", action="store_true")
    args = ap.parse_args()
    import uvicorn

    from api.app import create_app
    from knowledge.settings import ServiceSettings as Settings

    app = create_app(Settings(), graph_builder=fake_builder if args.fake else None)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    _serve()


DEPLOY_PHASES = ("deployment: the vLLM environment (built once, then cached)",
                 "deployment: starting vLLM with serve.sh (vllm-native; up to 900 s), then tokens and throughput",
                 "deployment: vLLM answered after 3.0 s; tokens through the server",
                 "deployment: throughput probe at concurrency 8")
DEPLOY_SUMMARY = "served by vLLM (vllm-native); tokens PASS; 400.0 tok/s at concurrency 8 (probe)"


def fake_deployer(state: dict[str, Any]) -> dict[str, Any]:
    """The deployment phase as the graph runs it (after the reporter), its phases as the real one announces them
    (agents/progress.py); the record it adds to the bundle is a stand-in: no vLLM is started."""
    from agents.progress import emit

    delay = float(os.environ.get("NPUPORT_FAKE_STEP_S", "0.05"))
    for text in DEPLOY_PHASES:
        emit("phase", text=text, node="deployer")
        time.sleep(delay)
    bundle = Path(state["bundle"]["dir"])
    record = {"status": "served", "implementation": "vllm-native", "tokens": {"ok": True},
              "throughput": {"rows": [{"concurrency": 8, "output_tokens_per_s": 400.0, "vs_one_at_a_time": 4.0}]},
              "budget": {"plan": "probe"}}
    report = json.loads((bundle / "report.json").read_text())
    (bundle / "report.json").write_text(json.dumps({**report, "deployment": record}))
    return {"deployment": {"status": "served", "summary": DEPLOY_SUMMARY},
            "trace": [step("deployer", f"deployment: {DEPLOY_SUMMARY}")]}


def fake_builder_with_deployment() -> StateGraph[Any]:
    """The stand-in graph with the deployment phase after its reporter."""
    g = fake_builder()
    g.add_node("deployer", fake_deployer)
    g.edges.discard((FAKE_NODES[-1], END))
    g.add_edge(FAKE_NODES[-1], "deployer")
    g.add_edge("deployer", END)
    return g
