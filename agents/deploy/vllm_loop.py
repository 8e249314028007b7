"""The real-NPU serving tuning loop: for each candidate setting, start ``vllm serve``, wait until it
answers, run vLLM's serving benchmark against it, parse the throughput, stop the server. It needs an
Ascend host with torch_npu, vllm and vllm-ascend; :func:`npu_available` says whether this is one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.tuning.search import Budget, Outcome, TuneResult, npuport_search
from agents.tuning.space import HostFacts, SearchSpace
from sandbox.serving.client import stop_server

_THROUGHPUT = re.compile(r"Output token throughput \(tok/s\):\s*([0-9.]+)")
_TTFT = re.compile(r"Median TTFT \(ms\):\s*([0-9.]+)")
_TPOT = re.compile(r"Median TPOT \(ms\):\s*([0-9.]+)")


def npu_available() -> tuple[bool, str]:
    """torch_npu importable and a device visible (probed in a child process)."""
    from sandbox.targets import probe_npu

    return probe_npu()


@dataclass
class ServingResult:
    output_tokens_per_s: float | None
    median_ttft_ms: float | None
    median_tpot_ms: float | None
    raw: str


def parse_bench_output(text: str) -> ServingResult:
    def grab(rx: re.Pattern[str]) -> float | None:
        m = rx.search(text)
        return float(m.group(1)) if m else None

    return ServingResult(grab(_THROUGHPUT), grab(_TTFT), grab(_TPOT), text[-4000:])


def serve_argv(model: Path, params: dict[str, Any], port: int) -> list[str]:
    argv = ["vllm", "serve", str(model), "--port", str(port),
            "--max-model-len", str(params["max_model_len"]), "--max-num-seqs", str(params["max_num_seqs"]),
            "--max-num-batched-tokens", str(params["max_num_batched_tokens"]),
            "--gpu-memory-utilization", str(params["gpu_memory_utilization"]),
            "--block-size", str(params.get("block_size", 128)),
            "--tensor-parallel-size", str(params.get("tensor_parallel_size", 1))]
    if params.get("enforce_eager"):
        argv.append("--enforce-eager")
    else:
        argv += ["--compilation-config",
                 json.dumps({"cudagraph_mode": params.get("cudagraph_mode", "FULL_AND_PIECEWISE")})]
    if not params.get("enable_chunked_prefill", True):
        argv.append("--no-enable-chunked-prefill")
    if params.get("additional_config"):
        argv += ["--additional-config", json.dumps(params["additional_config"])]
    if params.get("trust_remote_code"):
        argv.append("--trust-remote-code")
    return argv


def bench_argv(model: Path, port: int, concurrency: int, input_len: int, output_len: int, prompts: int) -> list[str]:
    return ["vllm", "bench", "serve", "--backend", "vllm", "--model", str(model), "--port", str(port),
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--num-prompts", str(prompts), "--max-concurrency", str(concurrency)]


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(2)
    return False


def measure(model: Path, params: dict[str, Any], env: dict[str, str], *, port: int = 8011, concurrency: int = 32,
            input_len: int = 512, output_len: int = 128, prompts: int = 128, start_timeout_s: float = 900) -> Outcome:
    """One trial: serve with ``params``, benchmark, stop."""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"npuport-vllm-{port}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(serve_argv(model, params, port), env={**os.environ, **env}, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not wait_ready(port, proc, start_timeout_s):
            tail = log.read_text(errors="replace")[-600:]
            return Outcome(None, "error", f"vllm serve did not come up: {tail}")
        r = subprocess.run(bench_argv(model, port, concurrency, input_len, output_len, prompts), capture_output=True,
                           text=True, env={**os.environ, **env}, timeout=3600)
        res = parse_bench_output(r.stdout + r.stderr)
        if res.output_tokens_per_s is None:
            return Outcome(None, "error", f"no throughput in the benchmark output: {res.raw[-300:]}")
        return Outcome(res.output_tokens_per_s, "ok", extras={"median_ttft_ms": res.median_ttft_ms,
                                                               "median_tpot_ms": res.median_tpot_ms})
    finally:
        stop_server(proc)


def tune_serving(model: Path, space: SearchSpace, facts: HostFacts, env: dict[str, str],
                 budget: Budget | None = None) -> TuneResult:
    """The serving search on a real NPU (raises RuntimeError without one)."""
    ok, why = npu_available()
    if not ok:
        raise RuntimeError(f"the vllm-ascend tuning loop needs an Ascend NPU: {why}")
    return npuport_search(space, facts, lambda p: measure(model, p, env),
                          budget or Budget(max_trials=10, max_seconds=7200))
