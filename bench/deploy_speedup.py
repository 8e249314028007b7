"""Tuned-port throughput / original-as-written throughput for ocr_mini on cpu, from one run.

    python bench/deploy_speedup.py [--trials 12] [--out DIR]

Ports examples/ocr_mini to the cpu target through the graph with tuning on; the tuner benchmarks the
tuned port and the original as written (eager, batch 1, under the cuda->cpu redirect) back to back
on this host, and this script prints both and their ratio (goal >= 10).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npuport-speedup-"))
    os.environ.setdefault("NPUPORT_HOME", str(work / "home"))
    os.environ["NPUPORT_TUNE_TRIALS"] = str(args.trials)
    from graph.runner import run_port

    out = args.out or work / "bundle"
    t0 = time.time()
    state = run_port({"request": {"model_path": str(ROOT / "examples" / "ocr_mini"), "target": "cpu",
                                  "out_dir": str(out), "tune": True}}, f"speedup-{int(t0)}")
    tuning = state.get("tuning") or {}
    if state.get("status") != "validated" or tuning.get("status") != "done":
        raise SystemExit(f"no speedup to report: {state.get('status')}: {state.get('reason')}; "
                         f"tuning: {tuning.get('detail')}")
    tuned, base = tuning["tuned"], tuning["baseline"]
    print(f"ocr_mini on cpu, {len(tuning['trials'])} tuning trials, {time.time() - t0:.0f} s in all; bundle: {out}")
    print(f"tuned configuration: {tuning['best']}")
    print(f"{'concurrency':>11} {'original tok/s':>15} {'tuned tok/s':>12} {'ratio':>7}")
    bmap = {p["concurrency"]: p["tokens_per_s"] for p in base.get("points") or []}
    for p in tuned.get("points") or []:
        b = bmap.get(p["concurrency"])
        ratio = f"{p['tokens_per_s'] / b:7.1f}" if b else "      -"
        print(f"{p['concurrency']:>11} {b if b is None else round(b, 2)!s:>15} {p['tokens_per_s']:>12.1f} {ratio}")
    speedup = tuned.get("speedup")
    print(f"\nspeedup at concurrency {tuned['concurrency']}: {speedup:.1f}x (goal >= 10: "
          f"{'met' if speedup and speedup >= 10 else 'NOT met'})")


if __name__ == "__main__":
    main()
