"""Batch scaling: ports per minute of the same batch with 1 and with 2 workers, side by side in one run.

Each port is limited to one compute thread (the manifest's `threads: 1` -> OMP_NUM_THREADS=1 for its
sandbox runs) and declares one CPU to Ray, so 2 workers run 2 ports at once. The batch: N tiny
CUDA-only models (tests/tiny_models.py) ported to the cpu target. The clock runs from the batch's
"running" event (after the executor started) to its "done" event, so Ray's start-up is not counted.
Goal: >= 1.6x ports per minute with 2 workers on a 2-core machine. Prints the figure last; exits 1
when the goal is missed. Usage: python bench/batch_scale.py [--models 6] [--executor ray|local]
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


def _zoo(root: Path, n: int) -> Path:
    from tests.tiny_models import write_tiny_model

    for i in range(n):
        write_tiny_model(root / f"m{i:02d}")
    manifest = root / "batch.yaml"
    manifest.write_text("name: scale\ndefaults: {target: cpu, threads: 1, num_cpus: 1}\nmodels:\n"
                        + "".join(f"  - path: m{i:02d}\n" for i in range(n)))
    return manifest


def run(manifest: Path, workers: int, executor: str, home: Path) -> dict[str, float]:
    from graph.batch.manifest import load_manifest
    from graph.batch.runner import BatchOptions, run_batch
    from graph.batch.store import BatchStore

    os.environ["NPUPORT_HOME"] = str(home)
    resolved = load_manifest(manifest)
    t0 = time.perf_counter()
    result = run_batch(resolved, BatchOptions(executor=executor, workers=workers,  # type: ignore[arg-type]
                                              out_dir=home / "out"))
    total = time.perf_counter() - t0
    store = BatchStore(home / "batches.sqlite")
    try:
        ev = [e for e in store.events(result.batch_id) if e["kind"] == "batch"]
        spans = [(a["started"], a["finished"]) for a in store.attempts(result.batch_id) if a["started"] and a["finished"]]
    finally:
        store.close()
    start = next(e["t"] for e in ev if e["data"].get("status") == "running")
    end = next(e["t"] for e in reversed(ev) if e["data"].get("status") == "done")
    ok = sum(p.status == "validated" for p in result.ports)
    if ok != len(result.ports):
        raise SystemExit(f"{len(result.ports) - ok} ports did not validate with {workers} workers; see {home}")
    # how many ports really ran at once (from the attempts' start and finish times)
    marks = sorted([(t0_, 1) for t0_, _ in spans] + [(t1_, -1) for _, t1_ in spans])
    level = peak = 0
    for _, d in marks:
        level += d
        peak = max(peak, level)
    return {"ports": len(result.ports), "batch_s": end - start, "total_s": total, "peak": peak,
            "ppm": len(result.ports) / (end - start) * 60}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=6)
    ap.add_argument("--executor", choices=("ray", "local"), default="ray")
    args = ap.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="npuport-batch-scale-") as tmp:
        manifest = _zoo(Path(tmp) / "zoo", args.models)
        one = run(manifest, 1, args.executor, Path(tmp) / "home-1")
        two = run(manifest, 2, args.executor, Path(tmp) / "home-2")
    load1 = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs; load average before {load0[0]:.2f}, after {load1[0]:.2f} "
          "(shared machine: other work competes for the cores)")
    print(f"{'workers':>8} {'ports':>6} {'at once':>8} {'batch s':>8} {'total s':>8} {'ports/min':>10}")
    for w, r in ((1, one), (2, two)):
        print(f"{w:>8} {r['ports']:>6.0f} {r['peak']:>8.0f} {r['batch_s']:>8.1f} {r['total_s']:>8.1f} {r['ppm']:>10.2f}")
    ratio = two["ppm"] / one["ppm"]
    met = ratio >= GOAL
    print(f"ports per minute, 2 workers vs 1 ({args.executor}, one compute thread per port): {ratio:.2f}x "
          f"(goal >= {GOAL}x: {'met' if met else 'MISSED'})")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
