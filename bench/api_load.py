"""Load on the HTTP service: N concurrent chat sessions each submit a small porting job.

    python bench/api_load.py --sessions 4                 # starts `python -m api.serve` on loopback
    python bench/api_load.py --sessions 8 --fake          # stand-in graph: the service alone, quick
    python bench/api_load.py --url http://127.0.0.1:8000 --token T --model examples/ocr_mini

Each session streams its job through the OpenAI-compatible chat (the official ``openai`` client)
and, beside it, follows the job's SSE events. Printed: p50/p95/max event latency (server commit
of an event -> the client has it), and lost events: events in the job's final log that the live
SSE stream or the chat stream did not deliver (goal 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(home: Path, token: str, workers: int, fake: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "NPUPORT_HOME": str(home), "NPUPORT_TOKENS": json.dumps({token: ["read", "write"]}),
           "NPUPORT_ALLOWED_ROOTS": str(REPO / "examples"), "NPUPORT_WORKERS": str(workers)}
    cmd = ([sys.executable, str(REPO / "tests" / "test_api_helpers.py"), "--port", str(port), "--fake"] if fake
           else [sys.executable, "-m", "api.serve", "--port", str(port), "--log-level", "warning"])
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def follow_sse(base: str, token: str, job_id: str, out: dict[str, Any]) -> None:
    """Record (seq, receipt time) of every event on the live stream."""
    got: list[tuple[int, float, float]] = []
    out["opened"] = time.time()  # events committed before this are replays, not live: no latency for them
    with httpx.Client(base_url=base, timeout=None) as c, \
            c.stream("GET", f"/v1/ports/{job_id}/events", headers={"Authorization": f"Bearer {token}"}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                ev = json.loads(line[5:].strip())
                if "seq" in ev:
                    got.append((ev["seq"], ev["t"], time.time()))
    out["sse"] = got


def session(i: int, base: str, token: str, model: str, target: str, results: list[dict[str, Any]]) -> None:
    client = OpenAI(base_url=f"{base}/v1", api_key=token, timeout=3600)
    res: dict[str, Any] = {"session": i}
    sse_thread: threading.Thread | None = None
    text = ""
    for chunk in client.chat.completions.create(
            model="npuport", stream=True, metadata={"conversation_id": f"load-{i}"},
            messages=[{"role": "user", "content": f"port the model in {model} on the {target}"}]):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        text += delta or ""
        if sse_thread is None and "job `" in text:
            res["job"] = text.split("job `")[1].split("`")[0]
            sse_thread = threading.Thread(target=follow_sse, args=(base, token, res["job"], res))
            sse_thread.start()
    res["chat_steps"] = text.count("- **")
    res["chat_text_end"] = text[-200:]
    if sse_thread is not None:
        sse_thread.join()
    if "job" in res:
        final = httpx.get(f"{base}/v1/ports/{res['job']}/events?stream=false",
                          headers={"Authorization": f"Bearer {token}"}).json()
        res["final"] = [(e["seq"], e["kind"]) for e in final]
    results.append(res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--url", help="an already running server (else one is started on loopback)")
    ap.add_argument("--token", default="bench-token")
    ap.add_argument("--model", default="ocr_mini", help="model folder, relative to an allowed root")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fake", action="store_true", help="stand-in graph (measures the service, not the port)")
    args = ap.parse_args()

    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="npuport-load-")
    base = args.url
    if base is None:
        proc, base = start_server(Path(tmp.name), args.token, args.workers, args.fake)
    results: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        threads = [threading.Thread(target=session, args=(i, base, args.token, args.model, args.target, results))
                   for i in range(args.sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        tmp.cleanup()
    wall = time.time() - t0
    latencies = [recv - sent for r in results for _, sent, recv in r.get("sse", []) if sent >= r.get("opened", 0)]
    lost = 0
    for r in results:
        final = r.get("final", [])
        live = {seq for seq, _, _ in r.get("sse", [])}
        lost += sum(1 for seq, _ in final if seq not in live)
        lost += max(0, sum(1 for _, kind in final if kind == "step") - r.get("chat_steps", 0))
    jobs_ok = sum(1 for r in results if "ended: **validated**" in r.get("chat_text_end", ""))
    lat = sorted(latencies)
    p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: float("nan"))
    print(f"sessions {args.sessions}, workers {args.workers}, {'fake' if args.fake else 'real'} graph, "
          f"wall {wall:.1f} s, jobs validated {jobs_ok}/{args.sessions}")
    print(f"live events {len(lat)}; latency ms p50 {p(0.5):.1f}  p95 {p(0.95):.1f}  max "
          f"{p(1.0) if lat else float('nan'):.1f}  mean {statistics.fmean(lat) * 1000 if lat else float('nan'):.1f}")
    print(f"lost events: {lost}")


if __name__ == "__main__":
    main()
