"""Benchmark-backed evaluation: each trial is one sandbox/bench/throughput.py run of the port with one
configuration; the baseline is the original as written (eager, batch 1) under the cuda->cpu redirect,
measured by the same benchmark on the same host."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agents.runs import RunSpec
from agents.tuning.search import Evaluate, Outcome
from sandbox.bench.runner import BenchRun, run_bench
from sandbox.isolation.process import Limits

TUNE_CONCURRENCY = 8  # the objective: new tokens/s with 8 requests in flight
REPORT_CONCURRENCIES = [1, 2, 4, 8]
BASELINE_CONFIG = {"id": "baseline", "batch": 1}  # as written: no dtype, threads, attn or compile changes
TRIAL_REPEATS = 3
HEADLINE_REPEATS = 5
"""A result the CLI, the report and the page print (the deployed figure, the original's at the same
batch) is measured like a trial (its own sandbox, one configuration, TUNE_CONCURRENCY, one warm-up wave)
with more repeats; `npuport verify` measures it the same way (headline_spec)."""


def headline_spec() -> dict[str, Any]:
    """How a printed result is measured: run_bench's concurrencies, warmup and repeats (verify uses it)."""
    return {"concurrencies": [TUNE_CONCURRENCY], "warmup": 1, "repeats": HEADLINE_REPEATS}


# torch's messages when two floating dtypes meet in one op (LayerNorm, Linear, matmul, index_add_, ...).
_DTYPE_MIX = re.compile(r"mixed dtype|expected scalar type|same (?:scalar )?(?:d)?types?\b|should be the same|"
                        r"dtypes? match|can't be cast to the desired output type", re.IGNORECASE)
_HALF_NAMES = re.compile(r"Half|BFloat16|float16", re.IGNORECASE)
_DEVICE_MIX = re.compile(r"\b(?:cuda|npu|xpu)\.\w*Tensor|same device", re.IGNORECASE)
_NO_KERNEL = re.compile(r"not implemented for '(?:Half|BFloat16)'")


def unsupported_reason(params: dict[str, Any], detail: str, frames: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(who, reason) when a trial failed only because its dtype knob asked for a dtype the model cannot run
    in, else None. The port was validated in float32, so a dtype mismatch in a float16/bfloat16 run is the
    model's code keeping or building tensors in another dtype (``.float()``, dtype=torch.float32 in
    forward, a float32 buffer) next to the cast weights; an op without a kernel for the dtype is the
    target's. Such a trial is no tuning result: the value cannot run at all, whatever the other knobs."""
    dtype = params.get("dtype")
    if not dtype or dtype == "float32":
        return None
    if _NO_KERNEL.search(detail):
        who = "this target's operators"
    elif _DTYPE_MIX.search(detail) and not _DEVICE_MIX.search(detail) and (
            "mixed dtype" in detail.lower() or _HALF_NAMES.search(detail)):
        who = "the model code"
    else:
        return None
    where = next((f for f in reversed(frames) if f.get("in_model")), None)
    at = f" (at {where['file']}:{where['line']} in {where['func']}: `{where['code'][:100]}`)" if where else ""
    hint = (f"; the code likely keeps or makes a tensor in another dtype (`.float()`, dtype=torch.float32 in "
            f"forward, a float32 buffer) next to the {dtype} weights") if who == "the model code" else ""
    return who, f"dtype {dtype} not supported by {who}: {detail}{at}{hint}"


def outcome_of(run: BenchRun) -> Outcome:
    if not run.ok:
        status = "timeout" if run.exec_result.status == "timeout" else "error"
        return Outcome(None, status, run.error())
    c = run.result["configs"][0]
    if c["status"] == "error":
        params = {k: v for k, v in (c.get("config") or {}).items() if k not in ("id", "concurrencies")}
        unsupported = unsupported_reason(params, c.get("detail", ""), c.get("frames") or [])
        if unsupported is not None:
            # The search runs no other point with this value (agents/tuning/search.py).
            return Outcome(None, "unsupported", unsupported[1],
                           extras={"rules_out": {"dtype": params["dtype"]}, "by": unsupported[0]})
    if c["status"] != "ok":
        return Outcome(None, c["status"], c.get("detail", ""))
    pt = c["points"][0]
    return Outcome(pt["tokens_per_s"], "ok", spread=pt.get("spread", 0.0),
                   extras={"effects": c.get("effects"), "runs": pt.get("tokens_per_s_runs"),
                           "latency_p50_s": pt.get("latency_p50_s"),
                           "latency_p99_s": pt.get("latency_p99_s"), "compile_s": c.get("compile_s"),
                           "run_dir": str(run.run_dir)})


class PortBench:
    """Runs the benchmark for one port (workspace) on its target, under the port's RunSpec (agents/runs.py:
    the same model folder, interpreter and --shrink config as the validation runs)."""

    def __init__(self, *, spec: RunSpec, original_dir: Path, runs_dir: Path,
                 reference_tokens: list[list[int]] | None, repeats: int = TRIAL_REPEATS) -> None:
        self.spec = spec
        self.workdir, self.model_dir, self.original_dir = spec.workdir, spec.model_dir, original_dir
        self.python, self.shrink = spec.python, spec.shrink
        self.manifest, self.target, self.runs_dir = spec.manifest, spec.target, runs_dir
        self.reference_tokens = reference_tokens
        self.limits: Limits = spec.limits
        self.repeats = repeats
        self.n = 0

    def port(self, configs: list[dict[str, Any]], concurrencies: list[int], tag: str,
             repeats: int | None = None) -> BenchRun:
        return self.spec.bench(self.runs_dir / tag, configs, concurrencies=concurrencies, warmup=1,
                               repeats=repeats or self.repeats, reference_tokens=self.reference_tokens)

    def headline(self, config: dict[str, Any], tag: str) -> BenchRun:
        """One configuration measured as a trial is, with HEADLINE_REPEATS: the figure that gets printed."""
        spec = headline_spec()
        return self.port([config], spec["concurrencies"], tag, repeats=spec["repeats"])

    def baseline(self, concurrencies: list[int], tag: str = "bench-baseline", batch: int = 1,
                 repeats: int | None = None) -> BenchRun:
        """The original as written under the cuda->cpu redirect; ``batch`` > 1 batches its requests as the
        deployed port does (the same harness batching), so the two are compared at the same batch."""
        return run_bench(workdir=self.workdir, model_dir=self.original_dir, run_dir=self.runs_dir / tag,
                         manifest=self.manifest, configs=[{**BASELINE_CONFIG, "batch": batch}], device="cuda",
                         redirect="cuda->cpu", concurrencies=concurrencies, warmup=1, repeats=repeats or self.repeats,
                         limits=self.limits, python=self.python, shrink=self.shrink)

    def evaluator(self) -> Evaluate:
        def evaluate(params: dict[str, Any]) -> Outcome:
            self.n += 1
            return outcome_of(self.port([{"id": f"trial-{self.n}", **params}], [TUNE_CONCURRENCY], f"trial-{self.n}"))

        return evaluate


def points_of(run: BenchRun, config_id: str | None = None) -> list[dict[str, Any]]:
    """The measured points of the run's first configuration (or the one with ``config_id``); [] when it
    did not run. A mismatching configuration is not measured: its speed is not the model's."""
    if not run.ok or not run.result.get("configs"):
        return []
    c = next((c for c in run.result["configs"] if config_id is None or c.get("id") == config_id), None)
    return list(c.get("points") or []) if c is not None and c["status"] == "ok" else []


def at(points: list[dict[str, Any]], concurrency: int) -> float | None:
    return next((p["tokens_per_s"] for p in points if p["concurrency"] == concurrency), None)
