"""Benchmark-backed evaluation: each trial is one sandbox/bench.py run of the port with one
configuration; the baseline is the original as written (eager, batch 1) under the cuda->cpu redirect,
measured by the same benchmark on the same host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.tuning.search import Evaluate, Outcome
from sandbox.bench import BenchRun, run_bench
from sandbox.process import Limits
from sandbox.targets import Target

TUNE_CONCURRENCY = 8  # the objective: new tokens/s with 8 requests in flight
REPORT_CONCURRENCIES = [1, 2, 4, 8]
BASELINE_CONFIG = {"id": "baseline", "batch": 1}  # as written: no dtype, threads, attn or compile changes


def outcome_of(run: BenchRun) -> Outcome:
    if not run.ok:
        status = "timeout" if run.exec_result.status == "timeout" else "error"
        return Outcome(None, status, run.error())
    c = run.result["configs"][0]
    if c["status"] != "ok":
        return Outcome(None, c["status"], c.get("detail", ""))
    pt = c["points"][0]
    return Outcome(pt["tokens_per_s"], "ok", spread=pt.get("spread", 0.0),
                   extras={"effects": c.get("effects"), "runs": pt.get("tokens_per_s_runs"), "latency_p50_s": pt.get("latency_p50_s"),
                           "latency_p99_s": pt.get("latency_p99_s"), "compile_s": c.get("compile_s"),
                           "run_dir": str(run.run_dir)})


class PortBench:
    """Runs the benchmark for one port (workspace) on its target."""

    def __init__(self, *, workdir: Path, model_dir: Path, original_dir: Path, manifest: dict[str, Any],
                 target: Target, runs_dir: Path, reference_tokens: list[list[int]] | None, wall_s: float = 600.0,
                 repeats: int = 3, python: str | None = None, shrink: bool = False) -> None:
        self.workdir, self.model_dir, self.original_dir = workdir, model_dir, original_dir
        self.python = python  # the layered environment's interpreter, when the model has its own pins
        self.shrink = shrink  # --shrink: the same derived small config as the validation runs
        self.manifest, self.target, self.runs_dir = manifest, target, runs_dir
        self.reference_tokens = reference_tokens
        self.limits = Limits(wall_s=wall_s)
        self.repeats = repeats
        self.n = 0

    def port(self, configs: list[dict[str, Any]], concurrencies: list[int], tag: str) -> BenchRun:
        return run_bench(workdir=self.workdir, model_dir=self.model_dir, run_dir=self.runs_dir / tag,
                         manifest=self.manifest, configs=configs, device=self.target.device,
                         target=self.target.harness_target() if self.target.bootstrap else None, env=self.target.env,
                         concurrencies=concurrencies, warmup=1, repeats=self.repeats,
                         reference_tokens=self.reference_tokens, limits=self.limits, python=self.python,
                         shrink=self.shrink)

    def baseline(self, concurrencies: list[int], tag: str = "bench-baseline") -> BenchRun:
        return run_bench(workdir=self.workdir, model_dir=self.original_dir, run_dir=self.runs_dir / tag,
                         manifest=self.manifest, configs=[dict(BASELINE_CONFIG)], device="cuda", redirect="cuda->cpu",
                         concurrencies=concurrencies, warmup=1, repeats=self.repeats, limits=self.limits,
                         python=self.python, shrink=self.shrink)

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
