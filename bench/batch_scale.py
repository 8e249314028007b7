"""Batch scaling: ports per minute of the same batch with 1 and with 2 workers, side by side in one run.

The batch: N tiny CUDA-only models (tests/tiny_models.py) ported to the cpu target, each port limited
to one compute thread (the manifest's `threads: 1` -> OMP_NUM_THREADS=1 for its sandbox runs; every
model asserts `torch.get_num_threads() == 1` in its decode loop, so a run that got more threads fails
the bench) and declaring one CPU to Ray, so 2 workers run 2 ports at once.

Fairness:
- the same batch (same manifest, same models) for both; each measured run gets a fresh npuport home,
  so neither finds the other's checkpoints, workspaces or results;
- warm caches for both: one unmeasured warm-up port first (page cache, bytecode caches, the native
  ascend-sim engine), then the runs in ABBA order (1, 2, 2, 1 workers), so drift on a shared machine and
  whatever the first measured run still warms weigh on both configurations alike;
- the clock: from the batch's "running" event (the executor is up: Ray's start-up and the embedded
  cluster's worker pool are not counted, they are once per batch, not per port) to its "done" event
  (results written). Everything a port costs, its worker process start, imports, knowledge-base / port
  memory reads and serialized writes, sandbox runs, is inside the clock for both configurations, and
  so is the driver's dispatch latency between ports. (The measured homes have no Chroma store; with one,
  each port's process opens it itself, in parallel, and only the port-memory write is serialized.) The table also shows
  the executor start-up that was left out, the mean time of one port (a port slower with 2 workers means the two
  compete for something) and how many ports really ran at once.
Goal: >= 1.6x ports per minute with 2 workers on a 2-core machine. Prints the load average (a shared
machine makes the figure noisy), the figure last; exits 1 when the goal is missed.
Usage: python bench/batch_scale.py [--models 6] [--executor ray|local] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL = 1.6
ONE_THREAD = 'assert torch.get_num_threads() == 1, "the port ran with more than one compute thread"'


def _zoo(root: Path, n: int, name: str = "scale") -> Path:
    from tests.tiny_models import write_tiny_model

    for i in range(n):
        write_tiny_model(root / f"m{i:02d}", twist=ONE_THREAD)
    manifest = root / f"{name}.yaml"
    manifest.write_text(f"name: {name}\ndefaults: {{target: cpu, threads: 1, num_cpus: 1}}\nmodels:\n"
                        + "".join(f"  - path: m{i:02d}\n" for i in range(n)))
    return manifest


def run(manifest: Path, workers: int, executor: str, home: Path) -> dict[str, float]:
    from graph.batch.manifest import load_manifest
    from graph.batch.runner import BatchOptions, run_batch
    from graph.batch.store import BatchStore

    os.environ["NPUPORT_HOME"] = str(home)
    resolved = load_manifest(manifest)
    t0 = time.time()
    result = run_batch(resolved, BatchOptions(executor=executor, workers=workers,  # type: ignore[arg-type]
                                              out_dir=home / "out"))
    store = BatchStore(home / "batches.sqlite")
    try:
        ev = [e for e in store.events(result.batch_id) if e["kind"] == "batch"]
        spans = [(a["started"], a["finished"])
                 for a in store.attempts(result.batch_id) if a["started"] and a["finished"]]
    finally:
        store.close()
    start = next(e["t"] for e in ev if e["data"].get("status") == "running")
    end = next(e["t"] for e in reversed(ev) if e["data"].get("status") == "done")
    ok = sum(p.status == "validated" for p in result.ports)
    if ok != len(result.ports):
        bad = "; ".join(f"{p.key}: {p.reason}" for p in result.ports if p.status != "validated")
        raise SystemExit(f"{len(result.ports) - ok} ports did not validate with {workers} workers ({bad}); see {home}")
    # how many ports really ran at once (from the attempts' start and finish times)
    marks = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    level = peak = 0
    for _, d in marks:
        level += d
        peak = max(peak, level)
    return {"ports": len(result.ports), "batch_s": end - start, "startup_s": start - t0, "peak": peak,
            "port_s": sum(f - s for s, f in spans) / max(1, len(spans))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--executor", choices=("ray", "local"), default="ray")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds (more rounds average out a load that drifts)")
    args = ap.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    load0 = os.getloadavg()
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="npuport-batch-scale-") as tmp:
        manifest = _zoo(Path(tmp) / "zoo", args.models)
        warm = _zoo(Path(tmp) / "warm", 1, name="warmup")
        run(warm, 1, args.executor, Path(tmp) / "home-warmup")
        for i, workers in enumerate((1, 2, 2, 1) * args.rounds):  # ABBA
            runs[workers].append(run(manifest, workers, args.executor, Path(tmp) / f"home-{i}-{workers}w"))
    load1 = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs; load average (1 min) before {load0[0]:.2f}, after {load1[0]:.2f}; "
          "a shared machine's other work competes for the cores")
    print(f"{'workers':>8} {'run':>4} {'ports':>6} {'at once':>8} {'port s':>7} {'batch s':>8} {'startup s':>10} "
          f"{'ports/min':>10}")
    ppm: dict[int, float] = {}
    for w in (1, 2):
        for j, r in enumerate(runs[w], 1):
            print(f"{w:>8} {j:>4} {r['ports']:>6.0f} {r['peak']:>8.0f} {r['port_s']:>7.1f} {r['batch_s']:>8.1f} "
                  f"{r['startup_s']:>10.1f} {r['ports'] / r['batch_s'] * 60:>10.2f}")
        ppm[w] = sum(r["ports"] for r in runs[w]) / sum(r["batch_s"] for r in runs[w]) * 60
        print(f"{w:>8} {'all':>4} {'':>6} {'':>8} {sum(r['port_s'] for r in runs[w]) / len(runs[w]):>7.1f} "
              f"{sum(r['batch_s'] for r in runs[w]):>8.1f} {'':>10} {ppm[w]:>10.2f}")
    ratio = ppm[2] / ppm[1]
    met = ratio >= GOAL
    print(f"ports per minute, 2 workers vs 1 ({args.executor}, one compute thread per port, ABBA after a warm-up): "
          f"{ratio:.2f}x (goal >= {GOAL}x: {'met' if met else 'MISSED'})")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
