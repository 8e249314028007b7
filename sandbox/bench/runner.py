"""The parent side of the tuner's benchmark: writes the ``BenchSpec``, runs sandbox/bench/throughput.py in the
sandbox under the run's supervisor, and rebuilds every point's throughput and latencies from the
supervisor's clock (sandbox/bench/measure.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.bench.measure import measured_bench
from sandbox.harness.runner import HarnessRun, option_paths
from sandbox.harness.spec import BenchSpec, HarnessTarget
from sandbox.isolation.process import (
    ExecResult,
    Limits,
    Mounts,
    Sandbox,
    default_sandbox,
    scrub,
    scrubbed_env,
)
from sandbox.isolation.rundir import discard, workspace_problem, write_own
from sandbox.isolation.supervised import decode, supervised_argv

MAX_RESULT_BYTES = 8 * 1024 * 1024


@dataclass
class BenchRun(HarnessRun):
    """A harness run whose result is a benchmark (same fields and verdicts as any harness run)."""

    def error(self) -> str:
        exc = self.result.get("exception") or {}
        if exc:
            return f"{exc.get('type')}: {str(exc.get('message', ''))[:300]}"
        tail = "\n".join(self.exec_result.stderr.strip().splitlines()[-5:])
        return f"the benchmark process ended ({self.exec_result.status}, code {self.exec_result.returncode}): {tail}"


def run_bench(
    *,
    workdir: Path,
    model_dir: Path,
    run_dir: Path,
    manifest: dict[str, Any],
    configs: list[dict[str, Any]],
    device: str = "cpu",
    target: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    redirect: str | None = None,
    concurrencies: list[int] | None = None,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
    reference_tokens: list[list[int]] | None = None,
    limits: Limits | None = None,
    sandbox: Sandbox | None = None,
    python: str | None = None,
    shrink: bool = False,
) -> BenchRun:
    """Run this module in the sandbox on ``model_dir`` for each configuration. ``redirect="cuda->cpu"``
    with ``device="cuda"`` runs the original as written (the baseline)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = (run_dir / "bench.json").resolve()
    spec = BenchSpec(
        model_dir=str(model_dir.resolve()), manifest=manifest, device=device, redirect=redirect,
        target=HarnessTarget(**target) if target else None, seed=seed, configs=tuple(configs) or BenchSpec.configs,
        concurrencies=tuple(concurrencies or (1,)), warmup=warmup, repeats=repeats, reference_tokens=reference_tokens,
        result_channel=True, result_path=str(result_path), shrink=shrink,
    )
    spec_path = run_dir / "bench_spec.json"
    write_own(spec_path, spec.to_json())
    discard(result_path)
    # The bench runs the model's code in a worker under the run's supervisor, which alone holds the result
    # pipe and the clock (sandbox/isolation/supervisor.py); the numbers are rebuilt from its timings here.
    argv = supervised_argv(python, "sandbox.bench.throughput", spec_path, MAX_RESULT_BYTES)
    box = sandbox or default_sandbox()
    # Under bwrap the run sees the model read-only and its run folder only (not npuport's git, not other runs).
    ro = [model_dir.resolve(), *option_paths((target or {}).get("options"))]  # npuport's caches only
    mounts = Mounts(hide=(workdir.resolve(),), ro=tuple(ro), rw=(run_dir.resolve(),),
                    interpreters=(python,) if python else ())
    # inductor compiles in the bench's own process: a pool of torch processes would read as the model's
    run_env = scrubbed_env({"TORCHINDUCTOR_COMPILE_THREADS": "1", **(env or {})})
    lim = limits or Limits()
    if full := workspace_problem(workdir, lim.workspace_quota_mb):  # the sum of every run folder of the port
        result = {"ok": False, "configs": [], "exception": {"type": "WorkspaceQuota", "message": full}}
        write_own(result_path, json.dumps(result, indent=1))
        return BenchRun(run_dir=run_dir, result=result, exec_result=ExecResult(
            returncode=None, status="killed", wall_s=0.0, stdout="", stderr="", isolation=box.name, notes=[full]))
    exec_result = box.execute(argv, cwd=run_dir.resolve(), env=run_env, limits=lim,
                              mounts=mounts, result_channel=True, channel_cap=MAX_RESULT_BYTES + 65536)
    write_own(run_dir / "bench_stdout.log", scrub(exec_result.stdout))
    write_own(run_dir / "bench_stderr.log", scrub(exec_result.stderr))
    sup = decode(exec_result)
    result: dict[str, Any] = {}
    if sup.unreadable == "too-large":
        result = {"ok": False, "configs": [], "exception": {"type": "BenchResultTooLarge",
                                                            "message": f"over {MAX_RESULT_BYTES} bytes"}}
    elif sup.unreadable:
        result = {"ok": False, "configs": [], "exception": {"type": "BenchResultUnreadable", "message": sup.unreadable}}
    elif sup.refused:
        result = {"ok": False, "configs": [], "exception": {
            "type": "UntrustedResult", "message": scrub(f"the supervisor refused the bench's result: {sup.refused}")}}
    elif sup.claims is not None:
        result = measured_bench(sup.claims, sup, reference_tokens)
    if not result:
        result = {"ok": False, "configs": [], "exception": None}
    result["supervisor"] = sup.note()
    write_own(result_path, json.dumps(result, indent=1, default=str))
    return BenchRun(run_dir=run_dir, exec_result=exec_result, result=result)

