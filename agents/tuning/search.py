"""Search: npuport's prior-guided coordinate search, plus random search and Optuna's default TPE for
comparison (bench/tuner_efficiency.py).

npuport's search (maximises the objective):
1. constraints prune the grid; nothing runs when nothing is feasible (``NoFeasiblePoint``);
2. start at the feasible point nearest the space's priors (domain knowledge: largest batch, all
   cores, float32, fused attention, no compile);
3. coordinate sweeps: along an ordered dimension walk outwards from the incumbent while throughput
   rises (a step must gain ``min_gain``, else it is noise); on a categorical dimension try the other
   values, best-first by a main-effects surrogate (the mean log-objective of earlier trials that had
   each value);
4. noise: points are compared on their median discounted by their runs' spread (SPREAD_PENALTY); a
   challenger that wins by less than the measured spread of the two is re-measured before it replaces
   the incumbent; repeats count as trials;
5. when a full sweep moves nothing, restarts once from the untried point the surrogate rates best
   (noise can strand the walk on a local optimum); stops early when the sweep around the restart
   improves nothing either, or at the trial / time budget.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.tuning.constraints import Constraint, constraints_for, explain_empty, prune
from agents.tuning.space import HostFacts, SearchSpace
from knowledge.errors import NoFeasiblePoint


@dataclass
class Outcome:
    value: float | None  # objective (tokens/s); None when the point could not run
    status: str = "ok"  # ok | infeasible | error | mismatch | timeout | unsupported
    detail: str = ""
    spread: float = 0.0  # relative spread of the repeats, (max - min) / median
    # extras["rules_out"] = {knob: value}: the value cannot run at all (an "unsupported" dtype), so no
    # other point with it is run
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trial:
    index: int
    params: dict[str, Any]
    outcome: Outcome
    elapsed_s: float
    note: str = ""  # "start", "sweep batch", "repeat", ...

    @property
    def value(self) -> float | None:
        return self.outcome.value


@dataclass
class Budget:
    max_trials: int = 12
    max_seconds: float = 900.0


@dataclass
class TuneResult:
    trials: list[Trial]
    best: Trial | None
    stopped: str  # why the search ended
    feasible: int
    pruned: int


Evaluate = Callable[[dict[str, Any]], Outcome]
# A point is judged by its median discounted by a quarter of its runs' spread: a steady configuration is the
# better deployment, and one lucky run of a noisy point must not pull the walk its way.
SPREAD_PENALTY = 0.25


class _Runner:
    """Evaluates points within the budget, remembering results (a point is run once unless repeated)."""

    def __init__(self, evaluate: Evaluate, budget: Budget) -> None:
        self.evaluate = evaluate
        self.budget = budget
        self.trials: list[Trial] = []
        self.seen: dict[tuple[Any, ...], list[Trial]] = {}
        self.ruled_out: dict[str, set[Any]] = {}  # knob -> values a trial showed cannot run
        self.t0 = time.monotonic()

    def rules_out(self, params: dict[str, Any]) -> bool:
        """True when a point has a knob value an earlier trial showed cannot run (it would fail the same way)."""
        return any(params.get(k) in values for k, values in self.ruled_out.items())

    def exhausted(self) -> str | None:
        if len(self.trials) >= self.budget.max_trials:
            return f"trial budget of {self.budget.max_trials} spent"
        if time.monotonic() - self.t0 >= self.budget.max_seconds:
            return f"time budget of {self.budget.max_seconds:g} s spent"
        return None

    def run(self, key: tuple[Any, ...], params: dict[str, Any], note: str) -> Trial:
        t = time.monotonic()
        outcome = self.evaluate(params)
        trial = Trial(len(self.trials) + 1, params, outcome, time.monotonic() - t, note)
        self.trials.append(trial)
        self.seen.setdefault(key, []).append(trial)
        for knob, value in (outcome.extras.get("rules_out") or {}).items():
            self.ruled_out.setdefault(knob, set()).add(value)
        return trial

    def value(self, key: tuple[Any, ...]) -> float | None:
        vals = [t.value for t in self.seen.get(key, []) if t.value is not None]
        return sorted(vals)[len(vals) // 2] if vals else None  # median (upper) of the repeats

    def steady(self, key: tuple[Any, ...]) -> float | None:
        """The median discounted by its spread (SPREAD_PENALTY): what the walk compares and the answer is."""
        v = self.value(key)
        return None if v is None else v / (1.0 + SPREAD_PENALTY * self.spread(key))

    def spread(self, key: tuple[Any, ...]) -> float:
        return max((t.outcome.spread for t in self.seen.get(key, [])), default=0.0)


def _distance(space: SearchSpace, a: dict[str, Any], b: dict[str, Any]) -> float:
    d = 0.0
    for dim in space.dims:
        if a.get(dim.name) == b.get(dim.name):
            continue
        if dim.ordered:
            d += abs(dim.values.index(a[dim.name]) - dim.values.index(b[dim.name]))
        else:
            d += 1.0
    return d


def _surrogate_order(runner: _Runner, dim_name: str, values: list[Any], rng: random.Random) -> list[Any]:
    """Main-effects surrogate: rank values by the mean log-objective of trials that used them; values
    never tried come after tried good ones but before tried bad ones (ties broken at random)."""
    logs: dict[Any, list[float]] = {}
    for t in runner.trials:
        v = t.params.get(dim_name)
        logs.setdefault(v, []).append(math.log(t.value) if t.value else -50.0)
    all_logs = [x for xs in logs.values() for x in xs]
    prior = sum(all_logs) / len(all_logs) if all_logs else 0.0
    noise = {v: rng.random() for v in values}
    return sorted(values, key=lambda v: (-(sum(logs[v]) / len(logs[v]) if v in logs else prior), noise[v]))


def _restart_point(space: SearchSpace, runner: _Runner, by_key: dict[tuple[Any, ...], dict[str, Any]],
                   rng: random.Random) -> tuple[Any, ...] | None:
    """The untried feasible point with the best main-effects prediction (sum over dimensions of the
    mean log-objective of trials sharing each value), or None when every point was tried."""
    untried = [k for k in by_key if k not in runner.seen and not runner.rules_out(by_key[k])]
    if not untried:
        return None
    logs: list[dict[Any, list[float]]] = [{} for _ in space.dims]
    for t in runner.trials:
        key = space.key(t.params)
        for i, v in enumerate(key):
            logs[i].setdefault(v, []).append(math.log(t.value) if t.value else -50.0)
    flat = [x for d in logs for xs in d.values() for x in xs]
    mean = sum(flat) / len(flat) if flat else 0.0

    def score(k: tuple[Any, ...]) -> float:
        return sum((sum(logs[i][v]) / len(logs[i][v])) if v in logs[i] else mean for i, v in enumerate(k))

    return max(untried, key=lambda k: (score(k), rng.random()))


def probe_once(runner: _Runner, by_key: dict[tuple[Any, ...], dict[str, Any]], key: tuple[Any, ...],
               note: str = "LLM proposal") -> bool:
    if key in runner.seen:
        return True
    if runner.exhausted() or runner.rules_out(by_key[key]):
        return False
    runner.run(key, by_key[key], note)
    return True


@dataclass
class _Walk:
    """The coordinate walk of npuport's search over the feasible points (``by_key``)."""

    space: SearchSpace
    runner: _Runner
    by_key: dict[tuple[Any, ...], dict[str, Any]]
    rng: random.Random
    min_gain: float

    def better(self, challenger: tuple[Any, ...], incumbent: tuple[Any, ...]) -> bool:
        """The challenger beats the incumbent by ``min_gain``; a win within the noise of the two is
        re-measured once before it counts."""
        runner = self.runner
        vc, vi = runner.steady(challenger), runner.steady(incumbent)
        if vc is None:
            return False
        if vi is None:
            return True
        margin = max(self.min_gain, 0.5 * max(runner.spread(challenger), runner.spread(incumbent)))
        if vc <= vi * (1 + self.min_gain):
            return False
        if vc <= vi * (1 + margin) and len(runner.seen[challenger]) < 2 and not runner.exhausted():
            runner.run(challenger, self.by_key[challenger], "repeat: the gain is within the noise")
            return self.better(challenger, incumbent)
        return vc > vi * (1 + self.min_gain)

    def probe(self, key: tuple[Any, ...], note: str) -> bool:
        """Run key unless seen; True when it ran or was known (and is a valid candidate)."""
        if key not in self.by_key:
            return False
        if key not in self.runner.seen:
            if self.runner.exhausted() or self.runner.rules_out(self.by_key[key]):
                return False
            self.runner.run(key, self.by_key[key], note)
        return True

    def take_proposals(self, cur: tuple[Any, ...], start: dict[str, Any],
                       proposals: list[dict[str, Any]]) -> tuple[Any, ...]:
        """Proposals (the LLM tuner's) are measured like any trial and replace the incumbent only when
        they win by the same margin; points outside the pruned space are never run."""
        for p in proposals:
            key = self.space.key({**start, **p})
            if key in self.by_key and probe_once(self.runner, self.by_key, key):
                vc, vi = self.runner.value(key), self.runner.value(cur)
                if vc is not None and (vi is None or vc > vi * (1 + self.min_gain)):
                    cur = key
        return cur

    def sweep_ordered(self, cur: tuple[Any, ...], i: int) -> tuple[Any, ...]:
        """Walk dimension i outwards from the incumbent while each step wins."""
        dim = self.space.dims[i]
        pos = dim.values.index(cur[i])
        best = cur
        for step in (+1, -1):  # toward larger first (the priors already sit at the large end)
            j = pos + step
            while 0 <= j < len(dim.values):
                key = cur[:i] + (dim.values[j],) + cur[i + 1:]
                if not self.probe(key, f"sweep {dim.name}"):
                    break
                if self.better(key, best):
                    best = key
                    j += step
                else:
                    break
            if best != cur:
                break  # improved going this way: no need to look back
        return best

    def sweep_categorical(self, cur: tuple[Any, ...], i: int) -> tuple[Any, ...]:
        """Try dimension i's other values, best-first by the surrogate."""
        dim = self.space.dims[i]
        best = cur
        others = [v for v in dim.values if v != cur[i]]
        for v in _surrogate_order(self.runner, dim.name, others, self.rng):
            key = cur[:i] + (v,) + cur[i + 1:]
            if self.probe(key, f"sweep {dim.name}") and self.better(key, best):
                best = key
        return best

    def sweep(self, cur: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
        """One sweep over every dimension: the new incumbent and whether it moved."""
        moved = False
        for i, dim in enumerate(self.space.dims):
            if len(dim.values) < 2:
                continue
            if self.runner.exhausted():
                break
            best = self.sweep_ordered(cur, i) if dim.ordered else self.sweep_categorical(cur, i)
            if best != cur:
                cur, moved = best, True
        return cur, moved


def npuport_search(space: SearchSpace, facts: HostFacts, evaluate: Evaluate, budget: Budget | None = None,
                   seed: int = 0, constraints: list[Constraint] | None = None, min_gain: float = 0.02,
                   feasible: list[dict[str, Any]] | None = None, restarts: int = 1,
                   proposals: list[dict[str, Any]] | None = None) -> TuneResult:
    budget = budget or Budget()
    rng = random.Random(seed)
    cons = constraints_for(space) if constraints is None else constraints
    pruned_n = 0
    if feasible is None:
        feasible, pruned = prune(space, facts, cons)
        pruned_n = len(pruned)
        if not feasible:
            raise NoFeasiblePoint(explain_empty(space, pruned))
    by_key = {space.key(p): p for p in feasible}
    runner = _Runner(evaluate, budget)
    walk = _Walk(space, runner, by_key, rng, min_gain)
    prior = {d.name: d.start() for d in space.dims}
    start = min(feasible, key=lambda p: (_distance(space, p, prior), rng.random()))
    cur = space.key(start)
    runner.run(cur, start, "start at the priors")
    cur = walk.take_proposals(cur, start, proposals or [])
    stopped = ""
    restarts_left = restarts
    while not stopped:
        cur, moved = walk.sweep(cur)
        stopped = runner.exhausted() or ""
        if not stopped and not moved:
            fresh = _restart_point(space, runner, by_key, rng) if restarts_left > 0 else None
            if fresh is None:
                stopped = "converged: a full sweep improved nothing" + (" after a restart" if restarts else "")
            else:
                # A local optimum under noise: restart once from the surrogate's best untried point.
                restarts_left -= 1
                runner.run(fresh, by_key[fresh], "restart at the surrogate's best untried point")
                cur = fresh  # sweep around it; the best point seen so far stays the answer unless beaten
    ok = [t for t in runner.trials if t.value is not None]
    best_trial = max(ok, key=lambda t: runner.steady(space.key(t.params)) or 0.0) if ok else None
    return TuneResult(runner.trials, best_trial, stopped, len(feasible), pruned_n)


def random_search(space: SearchSpace, facts: HostFacts, evaluate: Evaluate, budget: Budget | None = None,
                  seed: int = 0, feasible: list[dict[str, Any]] | None = None,
                  start: dict[str, Any] | None = None) -> TuneResult:
    """Feasible points in a seeded random order; ``start`` (a prior point) runs first."""
    budget = budget or Budget()
    pts = list(feasible if feasible is not None else prune(space, facts)[0])
    if not pts:
        raise NoFeasiblePoint(f"no configuration of {space.name!r} is feasible")
    random.Random(seed).shuffle(pts)
    if start is not None:
        skey = space.key(start)
        pts.sort(key=lambda p: space.key(p) != skey)  # stable: the rest keep their random order
    runner = _Runner(evaluate, budget)
    for p in pts:
        if runner.exhausted():
            break
        if not runner.rules_out(p):
            runner.run(space.key(p), p, "random")
    ok = [t for t in runner.trials if t.value is not None]
    return TuneResult(runner.trials, max(ok, key=lambda t: t.value or 0.0) if ok else None,
                      runner.exhausted() or "grid exhausted", len(pts), 0)


def tpe_search(space: SearchSpace, facts: HostFacts, evaluate: Evaluate, budget: Budget | None = None,
               seed: int = 0, feasible: list[dict[str, Any]] | None = None,
               start: dict[str, Any] | None = None) -> TuneResult:
    """Optuna's default TPE over the grid. A point the constraints reject costs no run (it is told
    the worst value); a point TPE suggests again is answered from memory without a new run.
    ``start`` (a prior point) is enqueued as the first trial, so TPE learns from its value."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = budget or Budget()
    pts = feasible if feasible is not None else prune(space, facts)[0]
    allowed = {space.key(p): p for p in pts}
    if not allowed:
        raise NoFeasiblePoint(f"no configuration of {space.name!r} is feasible")
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    if start is not None:
        study.enqueue_trial({d.name: start[d.name] for d in space.dims})
    runner = _Runner(evaluate, budget)

    def runnable() -> int:  # points not ruled out by an earlier trial's unsupported value
        return sum(1 for k, p in allowed.items() if k in runner.seen or not runner.rules_out(p))

    asks = 0
    while not runner.exhausted() and len(runner.seen) < runnable() and asks < 50 * budget.max_trials:
        asks += 1
        trial = study.ask()
        params = {d.name: trial.suggest_categorical(d.name, d.values) for d in space.dims}
        key = space.key(params)
        if key not in allowed or (key not in runner.seen and runner.rules_out(allowed[key])):
            study.tell(trial, 0.0)
            continue
        if key not in runner.seen:
            runner.run(key, allowed[key], "tpe")
        study.tell(trial, runner.value(key) or 0.0)
    ok = [t for t in runner.trials if t.value is not None]
    return TuneResult(runner.trials, max(ok, key=lambda t: t.value or 0.0) if ok else None,
                      runner.exhausted() or "grid exhausted", len(allowed), 0)
