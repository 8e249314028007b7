"""Emulator overhead (issue 25): what ascend-sim costs over plain CPU on the generate of real ports.

Each release is ported to ascend-sim the way a user ports it (`npuport port ... --target ascend-sim`;
the zoo's releases with --shrink, the demo as `npuport demo` ports it), then the port's own patched
model runs through the harness's generate path (what a port's run times: the sandbox, the layered
environment of its era, the decode profile) on ascend-sim and on cpu, with the same (shrunk) config,
inputs, seed, threads and dtype. Rounds interleave the two targets (A B A B, fresh sandboxes each
time); both sides must produce the same tokens, or the release is not measured.

Per run the harness reports wall time and the process's CPU time of each generate (best of
--repeats after --warmup). The judged figure is the CPU-time ratio: with one compute thread a
generate's CPU time is its cost, while its wall time on a shared 2-core host is that cost times
however long the run waited for a core (load 10 makes wall times 5-10x the CPU times, and the wait
differs between two runs seconds apart). The wall-time ratios are printed beside it. Per release:
the median over rounds of the per-round ratio; the figure is the median over releases (the worst
release is printed too). Goal: <= 1.3; the last line is the figure, exit 1 when missed or when a
release could not be measured.

    python bench/emulator_overhead.py [--zoo DIR] [--only a,b] [--rounds 3] [--repeats 5] [--threads 1]
                                      [--bundles DIR]

--bundles keeps the ports between runs (a validated bundle there is reused, not ported again).
NPUPORT_SIM_ENGINE=python measures the Python engine instead of the native one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL = 1.3
DEMO = "ocr_mini"
# Zoo releases that validate on both targets today (docs/benchmarks.md, zoo): decoders of four eras and
# attention styles (GLM, Falcon, InternLM2, MixFormer, StableLM, MPT/Replit).
RELEASES = ("chatglm2-6b", "falcon-7b-instruct", "internlm2-chat-7b", "phi-1_5-mixformer", "stable-code-3b",
            "replit-code-v1_5-3b")


@dataclass
class Release:
    name: str
    path: Path
    shrink: bool
    bundle: Path | None = None
    error: str = ""
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"cpu_s": [], "wall_s": []})
    sim: dict[str, list[float]] = field(default_factory=lambda: {"cpu_s": [], "wall_s": []})
    ops: int = 0

    def ratios(self, kind: str) -> list[float]:
        return [s / c for s, c in zip(self.sim[kind], self.cpu[kind], strict=False) if c > 0]


def port(rel: Release, out: Path, env: dict[str, str], target: str) -> None:
    """Port the release to the emulated target as a user would (no tuning, no serving), or reuse a
    validated bundle of the same request."""
    report = out / "report.json"
    if report.is_file():
        old = json.loads(report.read_text())
        req = old.get("request") or {}
        if old.get("status") == "validated" and req.get("target") == target and bool(req.get("shrink")) == rel.shrink:
            rel.bundle = out
            return
    cmd = [sys.executable, "-m", "api.cli", "port", str(rel.path), "--target", target, "--no-tune", "--no-serve",
           "--out", str(out), "--force", *(["--shrink"] if rel.shrink else [])]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    status = json.loads(report.read_text()).get("status") if report.is_file() else None
    if done.returncode != 0 or status != "validated":
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
        rel.error = f"the port did not validate ({took:.0f} s): {tail[0][:200]}"
        return
    print(f"  ported {rel.name} to {target} in {took:.0f} s", flush=True)
    rel.bundle = out


def _own_python(report: dict[str, Any]) -> str | None:
    """The env this bench's own port ran in (its bundle is this bench's, not a stranger's), if it still exists."""
    python = (report.get("environment") or {}).get("python")
    return python if python and Path(python).exists() else None


def run_specs(bundle: Path, workdir: Path) -> dict[str, Any]:
    """The port's own run conditions (as `npuport verify` rebuilds them) on its target and on cpu."""
    from agents.request import request_of
    from agents.runs import RunSpec
    from agents.state import target_of
    from sandbox.targets import REFERENCE_TARGET, resolve_target

    report = json.loads((bundle / "report.json").read_text())  # the port's state as the reporter wrote it
    req = request_of(report)
    t = target_of(report)
    emulated = resolve_target(t.name, chip=req.chip, torch_npu=req.torch_npu, strict=req.strict,
                              matrix_path=t.options.get("matrix_path"))
    base = RunSpec.of(workdir=workdir, model_dir=bundle / "patched", manifest=report.get("entry") or {},
                      target=emulated, request=report, python=_own_python(report))
    return {"sim": base, "cpu": base.replace(target=resolve_target(REFERENCE_TARGET))}


def measure_round(rel: Release, specs: dict[str, Any], run_dir: Path, extra: dict[str, Any], rnd: int) -> None:
    digests = {}
    for side in ("cpu", "sim"):  # A then B, every round
        spec = specs[side].replace(extra={**specs[side].extra, **extra})
        run = spec.harness(run_dir / f"{rel.name}-{side}-{rnd}")
        if not run.ok:
            exc = run.result.get("exception") or {}
            rel.error = f"the {side} run failed: {exc.get('type')}: {str(exc.get('message'))[:200]}"
            return
        timings = run.result["timings"]
        # The supervisor times the wall clock; the CPU time of each call is the harness's own figure from
        # inside the sandbox (timings_claimed): our harness on both sides, read alike.
        cpu_s = timings.get("run_cpu_s") or (run.result.get("timings_claimed") or {}).get("run_cpu_s")
        if not cpu_s:
            rel.error = f"the {side} run reported no CPU time per call"
            return
        getattr(rel, side)["cpu_s"].append(min(cpu_s))
        getattr(rel, side)["wall_s"].append(min(timings["run_s"]))
        digests[side] = (run.result.get("outputs") or {}).get("digest")
        if side == "sim":
            rel.ops = int((run.result.get("op_stats") or {}).get("op_total") or 0)
    if digests["cpu"] != digests["sim"]:
        rel.error = f"the targets' tokens differ ({digests['cpu']} vs {digests['sim']}): not the same computation"


def releases(args: argparse.Namespace) -> list[Release]:
    zoo = Path(args.zoo)
    found = [Release(DEMO, ROOT / "examples" / DEMO, shrink=False)]
    found += [Release(n, zoo / n, shrink=True) for n in RELEASES]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in {r.name for r in found}]
        if unknown:
            sys.exit(f"unknown release(s) {', '.join(unknown)}; choose from {', '.join(r.name for r in found)}")
        found = [r for r in found if r.name in wanted]
    for r in found:
        if not r.path.is_dir():
            r.error = f"not found at {r.path}"
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", default=str(ROOT.parent / "shared" / "data" / "zoo"))
    ap.add_argument("--only", default="", help=f"comma-separated names ({DEMO} is the demo)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="timed generate calls per run (the best one counts)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on both targets")
    ap.add_argument("--bundles", default="", help="keep (and reuse) the ports here")
    args = ap.parse_args()

    from sandbox.targets import EMULATED_TARGET

    rels = releases(args)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        home = os.environ.get("NPUPORT_HOME") or str(Path(tmp) / "home")
        env = dict(os.environ, NPUPORT_HOME=home, NPUPORT_SERVE="0")
        os.environ["NPUPORT_HOME"] = home
        bundles = Path(args.bundles) if args.bundles else Path(tmp) / "bundles"
        for rel in rels:
            if not rel.error:
                port(rel, bundles / rel.name, env, EMULATED_TARGET)
        specs = {r.name: run_specs(r.bundle, Path(tmp) / "work") for r in rels if r.bundle and not r.error}
        extra = {"warmup": args.warmup, "repeats": args.repeats, "threads": args.threads}
        engine = next((s["sim"].target.options.get("engine") for s in specs.values()), "?")
        for rnd in range(args.rounds):
            for rel in rels:
                if rel.name in specs and not rel.error:
                    measure_round(rel, specs[rel.name], Path(tmp) / "runs", extra, rnd)
            print(f"  round {rnd + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", flush=True)
    return report(rels, args, engine, load0)


def report(rels: list[Release], args: argparse.Namespace, engine: str, load0: float) -> int:
    print(f"ascend-sim ({engine} engine) / cpu on the ports' generate: best of {args.repeats} per run "
          f"({args.warmup} warm-up), {args.rounds} interleaved rounds, {args.threads} thread(s)")
    print(f"  {'release':22} {'cpu ms':>8} {'sim ms':>8} {'cpu-time ratio':>14} {'wall ratio':>10}  ops/gen  per-round")
    medians: list[float] = []
    for r in rels:
        if r.error or not r.ratios("cpu_s"):
            print(f"  {r.name:22} not measured: {r.error or 'no rounds'}")
            continue
        cpu_t, wall = statistics.median(r.ratios("cpu_s")), statistics.median(r.ratios("wall_s"))
        medians.append(cpu_t)
        per_gen = r.ops // max(1, args.warmup + args.repeats)
        print(f"  {r.name:22} {min(r.cpu['cpu_s']) * 1e3:8.1f} {min(r.sim['cpu_s']) * 1e3:8.1f} {cpu_t:14.2f} "
              f"{wall:10.2f}  {per_gen:7d}  {', '.join(f'{x:.2f}' for x in r.ratios('cpu_s'))}")
    missing = [r.name for r in rels if r.error or not r.ratios("cpu_s")]
    if not medians:
        print(f"emulator_overhead (load {os.getloadavg()[0]:.1f}): nothing measured -> FAIL")
        return 1
    median = statistics.median(medians)
    ok = median <= GOAL and not missing
    worst = max(medians)
    print(f"  worst release {worst:.2f}; wall-time ratios are shown for reference (load {load0:.1f} at the start)")
    print(f"emulator_overhead (load {os.getloadavg()[0]:.1f}): ascend-sim/cpu median CPU-time ratio {median:.2f} over "
          f"{len(medians)}/{len(rels)} releases (goal <= {GOAL})"
          + (f", not measured: {', '.join(missing)}" if missing else "") + f" -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
