"""Replay the recorded landscapes (bench/landscapes/*.json) and compare search methods by the number of
trials (runs) each needs to first reach 95% of the grid's optimum.

    python bench/tuner_efficiency.py [--seeds 20] [--max-trials 40]

Each replayed trial returns one of the point's recorded repeat measurements, drawn with the seed, so
the methods see the measurement noise the recording saw; "reaching 95%" is judged on the point's
recorded median. Points that did not run when recorded (errors, token mismatches) answer "failed".
A run that never reaches 95% within --max-trials counts as max-trials + 1 (and is flagged).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.tuning.search import Budget, Outcome, TuneResult, npuport_search, random_search, tpe_search  # noqa: E402
from agents.tuning.space import HostFacts, SearchSpace, space_from_dims  # noqa: E402

LANDSCAPES = ROOT / "bench" / "landscapes"
Method = Callable[..., TuneResult]
METHODS: dict[str, Method] = {"npuport": npuport_search, "random": random_search, "tpe (optuna default)": tpe_search}


def load(path: Path) -> tuple[SearchSpace, dict[tuple[Any, ...], dict[str, Any]], list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    cores = max(data["dims"].get("threads", [1]))
    facts = HostFacts(target=data["target"], chip=data.get("chip") or "910b", cores=cores)
    space = space_from_dims(data["name"], data["target"], data["dims"], facts)
    table = {space.key(p["params"]): p for p in data["points"]}
    feasible = [dict(p["params"]) for p in data["points"]]  # the recorded grid is the feasible set
    return space, table, feasible


def trials_to_95(space: SearchSpace, table: dict[tuple[Any, ...], dict[str, Any]], feasible: list[dict[str, Any]],
                 method: Method, seed: int, max_trials: int) -> tuple[int, bool]:
    rng = random.Random(seed * 7919 + 1)
    optimum = max(p["value"] for p in table.values() if p["value"])

    def evaluate(params: dict[str, Any]) -> Outcome:
        p = table[space.key(params)]
        if not p["value"]:
            return Outcome(None, p["status"], p.get("detail", ""))
        runs = p.get("runs") or [p["value"]]
        return Outcome(rng.choice(runs), "ok", spread=p.get("spread") or 0.0)

    facts = HostFacts(target=space.target, cores=max(space.dim("threads").values) if any(
        d.name == "threads" for d in space.dims) else 1)
    result = method(space, facts, evaluate, Budget(max_trials=max_trials, max_seconds=1e9), seed=seed,
                    feasible=feasible)
    for t in result.trials:
        true = table[space.key(t.params)]["value"]
        if true and true >= 0.95 * optimum:
            return t.index, True
    return max_trials + 1, False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--max-trials", type=int, default=40)
    ap.add_argument("--landscapes", type=Path, default=LANDSCAPES)
    args = ap.parse_args()
    files = sorted(args.landscapes.glob("*.json"))
    if not files:
        raise SystemExit(f"no landscapes in {args.landscapes}; run bench/record_landscapes.py first")
    header = f"{'landscape':34} {'points':>6} " + " ".join(f"{m:>22}" for m in METHODS)
    print(f"median trials to reach 95% of the grid optimum, over {args.seeds} seeds (max {args.max_trials})")
    print(header)
    overall: dict[str, list[int]] = {m: [] for m in METHODS}
    for f in files:
        space, table, feasible = load(f)
        cells = []
        for name, method in METHODS.items():
            counts, misses = [], 0
            for seed in range(args.seeds):
                n, hit = trials_to_95(space, table, feasible, method, seed, args.max_trials)
                counts.append(n)
                misses += not hit
            overall[name].extend(counts)
            med = statistics.median(counts)
            cells.append(f"{med:>8g} (p90 {sorted(counts)[int(0.9 * (len(counts) - 1))]:>3})" + (f" !{misses}" if misses else "   "))
        ok = sum(1 for p in table.values() if p["value"])
        print(f"{space.name:34} {ok:>3}/{len(table):<3}" + " ".join(f"{c:>22}" for c in cells))
    meds = {m: statistics.median(v) for m, v in overall.items()}
    print(f"{'all landscapes':34} {'':6} " + " ".join(f"{meds[m]:>22g}" for m in METHODS))
    tpe = meds["tpe (optuna default)"]
    ours = meds["npuport"]
    print(f"\nnpuport median {ours:g} trials (goal <= 12: {'met' if ours <= 12 else 'NOT met'}); "
          f"default TPE {tpe:g} (goal npuport <= half of TPE: {'met' if ours <= tpe / 2 else 'NOT met'}).")
    print("'!k' = k seeds never reached 95% within the trial cap (counted as cap + 1).")


if __name__ == "__main__":
    main()
