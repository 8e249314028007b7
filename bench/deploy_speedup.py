"""Tuned port vs the original under the same batch and threads, and each lever's share, for ocr_mini on cpu.

    python bench/deploy_speedup.py [--trials 12] [--out DIR]

Ports examples/ocr_mini to the cpu target through the graph with tuning on. The tuner's own report
compares the tuned port with the original as written at batch 1 and default threads: most of that
ratio is batch and threads, settings the original can use too. So, on the same host and in one run,
this bench measures at concurrency 8:

- the original (as written, under the cuda->cpu redirect it needs on a CUDA-less host) with the
  tuned batch and threads: the like-for-like baseline;
- the port from batch 1 upward, adding the tuned settings one lever at a time (batch, threads, dtype,
  attention, compile, ...): each lever's share of the port's gain is its log-ratio over the total;
- the port at batch 1 and tuned, both under the same cuda->cpu redirect the original needs: the
  redirect intercepts every torch call (a TorchFunctionMode), so it slows the original; this control
  measures that cost and gives the fully like-for-like ratio.

Goal: tuned port / original, both at the same batch and threads and both under the redirect, >= 10
(DESIGN's deploy speed-up, judged like for like). The ratio without the redirect on the port's side is
printed too. The last line is the figure; the exit status is 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXAMPLE = ROOT / "examples" / "ocr_mini"
CONCURRENCY = 8
GOAL = 10.0
LEVER_ORDER = ("batch", "threads", "dtype", "attn", "compile", "kv_cache")


def tps(run: Any, config_id: str) -> float | None:
    if not run.ok:
        return None
    for c in run.result.get("configs") or []:
        if c.get("id") == config_id and c.get("status") in ("ok", "mismatch"):
            pts = c.get("points") or []
            return float(pts[0]["tokens_per_s"]) if pts else None
    return None


def lever_steps(best: dict[str, Any]) -> list[dict[str, Any]]:
    """The port from batch 1 upward, adding the tuned settings one lever at a time."""
    levers = [k for k in LEVER_ORDER if k in best] + [k for k in best if k not in LEVER_ORDER]
    steps: list[dict[str, Any]] = [{"id": "port-base", "batch": 1}]
    cur: dict[str, Any] = {"batch": 1}
    for k in levers:
        cur = {**cur, k: best[k]}
        steps.append({"id": f"+{k}", **cur})
    return steps


def measure(state: dict[str, Any], best: dict[str, Any], work: Path, out: Path, repeats: int) -> dict[str, Any]:
    """The three benches of one run: the original, the port lever by lever, the port under the redirect."""
    from sandbox.bench.runner import run_bench
    from sandbox.isolation.process import Limits

    same = {k: best[k] for k in ("batch", "threads") if best.get(k) is not None}
    common = {"workdir": work, "concurrencies": [CONCURRENCY], "warmup": 1, "repeats": repeats,
              "limits": Limits(wall_s=1800)}
    orig = run_bench(model_dir=EXAMPLE, run_dir=work / "orig", manifest=state["entry"], device="cuda",
                     redirect="cuda->cpu", configs=[{"id": "orig-base", "batch": 1}, {"id": "orig-same", **same}],
                     **common)
    steps = lever_steps(best)
    port = run_bench(model_dir=out / "patched", run_dir=work / "port", manifest=state["entry"], device="cpu",
                     configs=steps, **common)
    # The same two port configurations under the original's redirect: its cost, and the like-for-like ratio.
    port_rd = run_bench(model_dir=out / "patched", run_dir=work / "port-redirect", manifest=state["entry"],
                        device="cpu", redirect="cuda->cpu",
                        configs=[{"id": "port-base-rd", "batch": 1}, {**steps[-1], "id": "tuned-rd"}], **common)
    return {"same": same, "orig": orig, "port": port, "port_rd": port_rd,
            "o_base": tps(orig, "orig-base"), "o_same": tps(orig, "orig-same"),
            "p_base_rd": tps(port_rd, "port-base-rd"), "tuned_rd": tps(port_rd, "tuned-rd"),
            "values": [(s["id"], tps(port, s["id"])) for s in steps]}


def print_levers(values: list[tuple[str, float | None]]) -> None:
    """Each lever's tok/s, its ratio over the step before and its share of the port's gain (log-ratio)."""
    base = values[0][1] or 1.0
    tuned = values[-1][1] or 0.0
    total = math.log(tuned / base) if tuned != base else 0.0
    print(f"{'port step':>14} {'tok/s':>9} {'x prev':>7} {'share of port gain':>19}")
    prev = base
    for sid, v in values:
        v = v or 0.0
        ratio = v / prev if prev else 0.0
        share = (math.log(ratio) / total) if total and ratio > 0 and sid != "port-base" else 0.0
        print(f"{sid:>14} {v:9.2f} {ratio:7.2f} {share:18.0%}")
        prev = v or prev


def print_ratios(m: dict[str, Any]) -> None:
    """The unlike and like-for-like ratios, and what the redirect costs the port."""
    values, o_base, o_same = m["values"], m["o_base"], m["o_same"]
    base, tuned, p_base_rd, tuned_rd = values[0][1] or 1.0, values[-1][1], m["p_base_rd"], m["tuned_rd"]
    if o_base:
        print(f"port at batch 1 / original at batch 1 (port fixes + redirect cost): {base / o_base:.2f}x")
        print(f"tuned / original at batch 1 (the old, unlike comparison): {tuned / o_base:.1f}x")
    print(f"redirect cost on the port at batch 1: {base:.2f} tok/s plain vs {p_base_rd:.2f} under the redirect "
          f"({base / p_base_rd:.2f}x); tuned: {tuned:.2f} vs {tuned_rd:.2f}")
    print(f"port at batch 1 / original at batch 1, both under the redirect (port fixes alone): "
          f"{p_base_rd / o_base:.2f}x" if o_base else "original at batch 1 not measured")
    print(f"tuned port (plain) / original at the same batch and threads (redirected): {tuned / o_same:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npuport-speedup-"))
    os.environ.setdefault("NPUPORT_HOME", str(work / "home"))
    os.environ["NPUPORT_TUNE_TRIALS"] = str(args.trials)
    from graph.runner import run_port

    out = args.out or work / "bundle"
    t0 = time.time()
    state = run_port({"request": {"model_path": str(EXAMPLE), "target": "cpu", "out_dir": str(out), "tune": True}},
                     f"speedup-{int(t0)}")
    tuning = state.get("tuning") or {}
    if state.get("status") != "validated" or tuning.get("status") != "done":
        print(f"no speedup to report: {state.get('status')}: {state.get('reason')}; tuning: {tuning.get('detail')}")
        print("deploy_speedup: not measured -> FAIL")
        return 1
    best: dict[str, Any] = dict(tuning["best"])
    m = measure(state, best, work, out, args.repeats)
    print(f"ocr_mini on cpu, {len(tuning['trials'])} tuning trials, {time.time() - t0:.0f} s in all; "
          f"tuned configuration {best}; load {os.getloadavg()[0]:.1f}")
    print(f"original as written, batch 1 (the tuner's baseline): {m['o_base'] or 0:.2f} tok/s")
    print(f"original as written, same batch/threads {m['same']}:      {m['o_same'] or 0:.2f} tok/s")
    if not (m["o_same"] and m["values"][-1][1] and m["values"][0][1] and m["tuned_rd"] and m["p_base_rd"]):
        orig, port, port_rd = m["orig"], m["port"], m["port_rd"]
        print(f"deploy_speedup: a measurement failed (original: {orig.error() if not orig.ok else 'ok'}; "
              f"port: {port.error() if not port.ok else 'ok'}; "
              f"port under redirect: {port_rd.error() if not port_rd.ok else 'ok'}) -> FAIL")
        return 1
    print_levers(m["values"])
    print_ratios(m)
    ratio = m["tuned_rd"] / m["o_same"]
    ok = ratio >= GOAL
    print(f"deploy_speedup (load {os.getloadavg()[0]:.1f}): tuned port / original, same batch, threads and "
          f"redirect = {ratio:.2f}x (goal >= {GOAL:g}) -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
