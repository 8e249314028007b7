"""Tuning a validated port: budgets, the model's facts, the search space and the search, measured in the sandbox."""

from __future__ import annotations

import platform
import time
from typing import Any

from agents import progress
from agents.models import TrialRecord, Tuning
from agents.request import PortRequest, request_of
from agents.runs import run_spec
from agents.state import entry_of, numerics_of, runs_of, target_of, workdir_if_set, workdir_of
from agents.tuning.constraints import constraints_for, prune
from agents.tuning.measure import (
    HEADLINE_REPEATS,
    REPORT_CONCURRENCIES,
    TRIAL_REPEATS,
    TUNE_CONCURRENCY,
    PortBench,
    at,
    points_of,
)
from agents.tuning.search import Budget, Evaluate, TuneResult, npuport_search
from agents.tuning.space import HostFacts, SearchSpace, model_facts, torch_space
from agents.workspace import Workspace
from knowledge.errors import NoFeasiblePoint
from knowledge.settings import settings
from sandbox.isolation.process import Limits

DEFAULT_TRIALS = 12


def budget_of(req: PortRequest | dict[str, Any]) -> Budget:
    """Trials and seconds for the search: the request's ``tune_trials`` / ``tune_time_s`` when given,
    else NPUPORT_TUNE_TRIALS / NPUPORT_TUNE_TIME_S, else 12 trials and half the port's wall budget."""
    conf = settings()
    req = request_of(req)
    trials = req.tune_trials or conf.tune_trials or DEFAULT_TRIALS
    secs = req.tune_time_s or conf.tune_time_s or float(req.max_wall_s) / 2
    return Budget(max_trials=int(trials), max_seconds=float(secs))


def facts_of(state: dict[str, Any]) -> HostFacts:
    req = request_of(state)
    manifest = entry_of(state)
    model_dir = workdir_of(state) / "model"
    from knowledge.untrusted import read_model_config

    config = read_model_config(model_dir, manifest)  # the model's file, read outside the sandbox: inside its folder
    code = list(model_dir.rglob("*.py"))
    facts = model_facts(config, has_custom_code=bool(code))
    if code and facts.attn_impls and not any("attn_implementation" in f.read_text(errors="replace") for f in code):
        # The config names an implementation but the model's own code never reads it: the knob would
        # change nothing in the run, so it is not searched.
        facts.attn_impls = ()
    ref = _reference_tokens(state) or [[]]
    facts.new_tokens = max(1, len(ref[0]))
    return HostFacts(target=target_of(state).name, chip=req.chip, model=facts)


def _reference_tokens(state: dict[str, Any]) -> list[list[int]] | None:
    numerics = numerics_of(state)
    return numerics.reference_tokens if numerics else None


def space_for(facts: HostFacts) -> SearchSpace:
    # compile "reduce-overhead" is CUDA graphs; the constraint prunes it on the CPU, kept for npu.
    return torch_space(facts, batches=[1, 2, 4, 8], compile_modes=["none", "default", "reduce-overhead"])


def trial_records(result: TuneResult) -> list[TrialRecord]:
    out = []
    for t in result.trials:
        o = t.outcome
        parts = [t.note, f"{t.elapsed_s:.1f} s"]
        if o.value is not None:
            parts.append(f"spread {o.spread:.0%}")
        if o.detail:
            parts.append(o.detail[:300])
        out.append(TrialRecord(id=f"trial-{t.index}", params=t.params, value=o.value, status=o.status,
                               detail="; ".join(parts)))
    return out


def unsupported_values(result: TuneResult) -> dict[str, str]:
    """"knob=value" -> why it cannot run ("not supported by the model code: <error> (at file:line ...)"),
    for the values a trial ruled out: they are no tuning result, and the report says so."""
    out: dict[str, str] = {}
    for t in result.trials:
        for knob, value in (t.outcome.extras.get("rules_out") or {}).items():
            _, sep, why = t.outcome.detail.partition(" not supported ")  # "dtype float16 not supported by ..."
            out.setdefault(f"{knob}={value}", f"not supported {why}" if sep else t.outcome.detail)
    return dict(sorted(out.items()))


def unsupported_sentence(unsupported: dict[str, str]) -> str:
    """One clause for the tuning summary: which knob values could not run, and by whom."""
    by: dict[str, list[str]] = {}
    for kv, reason in unsupported.items():
        who = reason.removeprefix("not supported by ").split(":", 1)[0]
        by.setdefault(who, []).append(kv)
    return "; ".join(f"{', '.join(kvs)} not supported by {who} (not a tuning result)" for who, kvs in by.items())


def llm_proposals(state: dict[str, Any], space: SearchSpace, facts: HostFacts) -> tuple[list[dict[str, Any]], str]:
    """The LLM tuner's proposals (policy llm/hybrid with an endpoint), kept only when they are points of
    the constraint-pruned space; the note says how many were proposed, kept and rejected."""
    from agents.llm.assist import llm_enabled, propose_trials

    req = request_of(state)
    if not llm_enabled(req.policy):
        return [], ""
    feasible, _pruned = prune(space, facts, constraints_for(space))
    keys = {space.key(p) for p in feasible}
    start = {d.name: d.start() for d in space.dims}
    values = {d.name: list(d.values) for d in space.dims}
    proposed, note = propose_trials(workdir_if_set(state), values, [], req.objective)
    kept = [p for p in proposed if space.key({**start, **p}) in keys]
    if proposed:
        note += (f"; {len(kept)} inside the constraint space, {len(proposed) - len(kept)} rejected (pruned by "
                 "constraints)")
        from agents.reasoning import think

        think("tuner", "llm", note + "; the optimiser measures them and judges")
    return kept, note


def search(space: SearchSpace, facts: HostFacts, evaluate: Evaluate, budget: Budget,
           proposals: list[dict[str, Any]] | None = None) -> tuple[Tuning, TuneResult | None]:
    """Run the search; an empty feasible space ends with status failed and the reason, nothing run."""
    try:
        result = npuport_search(space, facts, evaluate, budget, proposals=proposals)
    except NoFeasiblePoint as exc:
        return Tuning(status="failed", detail=str(exc)), None
    tuning = Tuning(status="done" if result.best else "failed", trials=trial_records(result),
                    unsupported=unsupported_values(result))
    if result.best is None:
        tuning.detail = f"no trial ran successfully ({len(result.trials)} tried; {result.stopped})"
        if tuning.unsupported:
            tuning.detail += f"; {unsupported_sentence(tuning.unsupported)}"
    else:
        tuning.best = dict(result.best.params)
    return tuning, result


def _reporting(evaluate: Evaluate, n: int) -> Evaluate:
    """The evaluator, telling the live displays (CLI, web page) each trial's start and result."""
    k = 0

    def run(params: dict[str, Any]) -> Any:
        nonlocal k
        k += 1
        progress.emit("trial_start", k=k, n=n, params=params)
        outcome = evaluate(params)
        # "dtype X not supported by ..."
        why = outcome.detail.split(":", 1)[0] if outcome.status == "unsupported" else ""
        progress.emit("trial_done", k=k, n=n, params=params, value=outcome.value, outcome=outcome.status,
                      **({"reason": why} if why else {}))
        return outcome

    return run


def fmt_params(params: dict[str, Any] | None) -> str:
    """{'batch': 4, 'attn': None} -> 'batch=4': a knob left at the model's default is not printed as None."""
    return " ".join(f"{k}={v}" for k, v in (params or {}).items() if v is not None) or "-"


def skeleton_tuning(state: dict[str, Any]) -> Tuning:
    runs = runs_of(state)
    port = next((r for r in reversed(runs) if r.purpose == "port" and r.ok), None)
    ref = next((r for r in runs if r.purpose == "reference" and r.ok), None)
    tuning = Tuning(status="skipped", detail="tuning not requested; timings recorded from the validation runs")
    if port:
        tuning.tuned = {"run_s": port.timings.get("run_s"), "target": port.target}
    if ref:
        tuning.baseline = {"run_s": ref.timings.get("run_s"), "target": ref.target}
    return tuning


def tune_port(state: dict[str, Any], space: SearchSpace | None = None) -> Tuning:
    req = request_of(state)
    ws = Workspace(workdir_of(state))
    original = ws.root / "original"
    ws.original_tree(original)
    target = target_of(state)
    facts = facts_of(state)
    space = space or space_for(facts)
    ref_tokens = _reference_tokens(state)
    # a benchmark runs the model several times over: twice one run's limit
    spec = run_spec(state, target).replace(limits=Limits(wall_s=float(req.run_timeout_s) * 2))
    bench = PortBench(spec=spec, original_dir=original, runs_dir=ws.runs_dir / "tuning", reference_tokens=ref_tokens)
    t0 = time.monotonic()
    budget = budget_of(req)
    proposals, llm_note = llm_proposals(state, space, facts)
    tuning, result = search(space, facts, _reporting(bench.evaluator(), budget.max_trials), budget, proposals)
    if llm_note:
        tuning.detail = f"{tuning.detail}; {llm_note}" if tuning.detail else llm_note
    if result is None or not tuning.best:
        return tuning
    # Final measurements, same host, each as a trial is measured (own sandbox, one configuration, the
    # tuning concurrency) with more repeats: the deployed figure is the one `npuport verify` re-measures.
    progress.emit("phase", text="final benchmark: the tuned and the untuned port, then the original at the same batch")
    searched = dict(tuning.best)
    tuned_head = points_of(bench.headline({"id": "tuned", **searched}, "bench-tuned"))
    same = {k: v for k, v in searched.items() if v is not None} == UNTUNED_CONFIG
    untuned_head = tuned_head if same else points_of(bench.headline({"id": "untuned", **UNTUNED_CONFIG},
                                                                    "bench-untuned"))
    deployed, _ = settle(searched, tuned_head, untuned_head, None)
    # The curve over concurrency (plot, table) of the deployed configuration; the headline point stays its own.
    curve_run = bench.port([{"id": "deployed", **deployed}], [c for c in REPORT_CONCURRENCIES if c != TUNE_CONCURRENCY],
                           "bench-curve")
    curve = points_of(curve_run)
    batch = int(deployed.get("batch") or 1)
    base_run = bench.baseline(sorted({1, TUNE_CONCURRENCY}), batch=batch, repeats=HEADLINE_REPEATS)
    base_how = f"batch {batch}, as the deployed port"
    if not points_of(base_run) and batch > 1:
        why = base_run.error() or "it did not run batched"
        base_run = bench.baseline(sorted({1, TUNE_CONCURRENCY}), batch=1, repeats=HEADLINE_REPEATS)
        base_how = f"batch 1 (it did not run at batch {batch}: {why[:160]})"
        batch = 1
    base_pts = points_of(base_run)
    host = {"machine": platform.machine(), "cores": facts.cores,
            "processor": platform.processor() or platform.machine()}
    tuning.baseline = {"what": f"original as written, eager, {base_how}, cuda->cpu redirect, CPU float32",
                       "config": {"batch": batch}, "target": "cpu (cuda->cpu redirect)", "points": base_pts,
                       "tokens_per_s": at(base_pts, TUNE_CONCURRENCY),
                       "error": "" if base_run.ok else base_run.error()}
    chose_tuned = deployed == searched
    spread = host_spread(tuned_head + untuned_head + base_pts, [t for t in tuning.trials], searched,
                         at(tuned_head, TUNE_CONCURRENCY))
    tuning.best, tuning.tuned = settle(searched, sorted(tuned_head + (curve if chose_tuned else []), key=_conc),
                                       sorted(untuned_head + ([] if chose_tuned else curve), key=_conc),
                                       tuning.baseline["tokens_per_s"], spread)
    tuning.tuned.update({"target": target.name, "knob_effects": knob_effects(result),
                         "space": space.name, "stopped": result.stopped, "feasible_points": result.feasible,
                         "pruned_points": result.pruned, "search_s": round(time.monotonic() - t0, 1), "host": host,
                         "measured_on": f"{target.name} on this host ({host['machine']}, {host['cores']} cores)",
                         "measured_as": (f"each figure in its own sandbox run at concurrency {TUNE_CONCURRENCY}, "
                                         f"1 warm-up wave, median of {HEADLINE_REPEATS} runs (trials: "
                                         f"{TRIAL_REPEATS}); the original at batch {batch}"),
                         "compared_at": {"batch": batch, "concurrency": TUNE_CONCURRENCY},
                         "slower_at": slower_at(tuning.tuned["points"], base_pts, spread),
                         "error": "" if curve_run.ok else curve_run.error()})
    tuning.detail = performance_sentence(tuning.tuned) + (f"; {llm_note}" if llm_note else "")
    if tuning.unsupported:
        tuning.detail += f"; {unsupported_sentence(tuning.unsupported)}"
    return tuning


def _conc(point: dict[str, Any]) -> int:
    return int(point.get("concurrency") or 0)


def slower_at(deployed: list[dict[str, Any]], original: list[dict[str, Any]],
              spread: float = 0.0) -> list[dict[str, Any]]:
    """Every concurrency at which both were measured and the deployed port was slower than the original by more
    than the host's spread (a difference within it is not a conclusion)."""
    base = {p["concurrency"]: p["tokens_per_s"] for p in original if p.get("tokens_per_s") is not None}
    return [{"concurrency": p["concurrency"], "port": p["tokens_per_s"], "original": base[p["concurrency"]]}
            for p in deployed if p.get("concurrency") in base and p.get("tokens_per_s") is not None
            and compare(p["tokens_per_s"], base[p["concurrency"]], spread) == "slower"]


UNTUNED_CONFIG: dict[str, Any] = {"batch": 1}  # the port as validated: no knob changed


def settle(searched: dict[str, Any], tuned_pts: list[dict[str, Any]], untuned_pts: list[dict[str, Any]],
           base_tps: float | None, spread: float = 0.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the configuration to deploy, the "tuned" record): the search's best and the untuned port compared
    at the tuning concurrency; the faster one is deployed, and the record says which and by how much.
    A value that was not measured stays None."""
    tuned_tps, untuned_tps = at(tuned_pts, TUNE_CONCURRENCY), at(untuned_pts, TUNE_CONCURRENCY)
    chosen = "tuned"
    if untuned_tps is not None and (tuned_tps is None or untuned_tps > tuned_tps):
        chosen = "untuned"
    best = dict(searched) if chosen == "tuned" else dict(UNTUNED_CONFIG)
    pts, value = (tuned_pts, tuned_tps) if chosen == "tuned" else (untuned_pts, untuned_tps)
    return best, {"config": best, "chosen": chosen, "points": pts, "tokens_per_s": value,
                  "concurrency": TUNE_CONCURRENCY, "speedup": ratio(value, base_tps),
                  "vs_original": compare(value, base_tps, spread), "spread": spread,
                  "search_best": {"config": searched, "tokens_per_s": tuned_tps, "points": tuned_pts},
                  "untuned": {"config": dict(UNTUNED_CONFIG), "tokens_per_s": untuned_tps},
                  "tuned_vs_untuned": compare(tuned_tps, untuned_tps, spread)}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


NOT_COMPARABLE = "not comparable"
MAX_RESOLVABLE_SPREAD = 0.5
"""Runs of one configuration that spread more than this ((max - min) / median) resolve no faster or slower."""


def compare(a: float | None, b: float | None, spread: float = 0.0) -> str:
    """"faster" / "slower" / "not comparable" / "not measured": a against b, by the medians the benchmark
    reported. ``spread``: how far measurements of one configuration moved on this host (their runs' spread, a
    trial against its re-measurement); a difference within it, or a spread past MAX_RESOLVABLE_SPREAD, is not
    comparable: no faster or slower conclusion is drawn from noise."""
    if a is None or b is None:
        return "not measured"
    if spread > MAX_RESOLVABLE_SPREAD or abs(a - b) <= spread * max(a, b):
        return NOT_COMPARABLE
    return "faster" if a > b else "slower" if a < b else "equal"


def host_spread(points: list[dict[str, Any]], trials: list[Any] | None = None,
                config: dict[str, Any] | None = None, value: float | None = None) -> float:
    """How far measurements moved on this host: the largest spread of the points' runs, and, when ``config`` was
    also a search trial, its trial figure against its re-measurement ``value`` (87 tok/s in a trial and 9 in the
    final benchmark is a host too noisy to compare on)."""
    spread = max((float(p.get("spread") or 0) for p in points), default=0.0)
    if config is not None and value:
        want = {k: v for k, v in config.items() if v is not None}
        seen = [float(t.value) for t in trials or [] if t.value
                and {k: v for k, v in (t.params or {}).items() if v is not None} == want]
        spread = max([spread] + [abs(v - value) / min(v, value) for v in seen])
    return round(spread, 3)


def not_comparable_text(spread: float) -> str:
    return f"not comparable on this host (spread {spread:.0%}): no faster/slower conclusion"


def tps(v: float | None) -> str:
    return "not measured" if v is None else f"{v:.1f} tokens/s"


def performance_sentence(tuned: dict[str, Any]) -> str:
    """What the final benchmark showed, in words that never call a slower port an improvement."""
    conc = tuned.get("concurrency")
    search = tuned.get("search_best") or {}
    untuned = tuned.get("untuned") or {}
    parts = []
    spread = float(tuned.get("spread") or 0)
    if tuned.get("chosen") == "untuned" and tuned.get("tuned_vs_untuned") == NOT_COMPARABLE:
        parts.append(f"the tuned configuration ({fmt_params(search.get('config'))}, {tps(search.get('tokens_per_s'))}) "
                     f"and the untuned port ({tps(untuned.get('tokens_per_s'))}) at concurrency {conc} are "
                     f"{not_comparable_text(spread)}; the deploy uses the untuned configuration")
    elif tuned.get("chosen") == "untuned":
        parts.append(f"the tuned configuration ({fmt_params(search.get('config'))}, {tps(search.get('tokens_per_s'))}) "
                     f"was SLOWER than the untuned port ({tps(untuned.get('tokens_per_s'))}) at concurrency {conc}; "
                     "the deploy uses the untuned configuration")
    else:
        parts.append(f"deployed {fmt_params(tuned.get('config'))}: {tps(tuned.get('tokens_per_s'))}"
                     f"{_spread(tuned.get('points'), conc)} at concurrency {conc} vs the untuned port "
                     f"{tps(untuned.get('tokens_per_s'))}")
    vs, speed = tuned.get("vs_original"), tuned.get("speedup")
    same = tuned.get("compared_at") or {}
    where = f" at batch {same['batch']}, concurrency {same['concurrency']}" if same else ""
    if vs == "not measured" or speed is None:
        parts.append("the original was not measured: no speed-up is claimed")
    elif vs == NOT_COMPARABLE:
        parts.append(f"against the original{where}: {not_comparable_text(spread)} ({speed:.2f}x measured)")
    elif vs == "slower":
        parts.append(f"the port is SLOWER than the original{where} ({speed:.2f}x, {tps(tuned.get('tokens_per_s'))} vs "
                     "the original's), not an improvement")
    else:
        parts.append(f"{speed:.2f}x the original's throughput{where}")
    for s in tuned.get("slower_at") or []:
        if s["concurrency"] != conc or vs != "slower":
            parts.append(f"SLOWER than the original at concurrency {s['concurrency']} "
                         f"({s['port']:.1f} vs {s['original']:.1f} tokens/s)")
    return "; ".join(parts)


def _spread(points: list[dict[str, Any]] | None, conc: Any) -> str:
    """" (median of 5 runs, spread 12%)" for the point at ``conc``: how noisy the printed figure is."""
    p = next((p for p in points or [] if p.get("concurrency") == conc), None)
    if not p or not p.get("tokens_per_s_runs"):
        return ""
    return f" (median of {len(p['tokens_per_s_runs'])} runs, spread {float(p.get('spread') or 0):.0%})"


def knob_effects(result: TuneResult) -> dict[str, str]:
    """Per searched knob: whether trials that differ in it executed differently (their recorded effects:
    dtype, threads, attention read back from the model, compiled modules, rows per call, aten ops)."""
    effects: dict[tuple[Any, ...], Any] = {}
    ruled_out: dict[str, dict[str, str]] = {}  # knob -> {value that cannot run: by whom}; compared with nothing
    for t in result.trials:
        for knob, value in (t.outcome.extras.get("rules_out") or {}).items():
            ruled_out.setdefault(knob, {})[f"{value}"] = str(t.outcome.extras.get("by") or "the model code")
        if t.outcome.status == "unsupported":
            continue
        e = (t.outcome.extras or {}).get("effects")
        if e is None and t.outcome.status in ("error", "infeasible", "mismatch"):
            e = {"failed": t.outcome.status}  # the setting made the run fail: it did change what ran
        if e is not None:
            effects[tuple(sorted(t.params.items(), key=lambda kv: kv[0]))] = e
    out: dict[str, str] = {}
    keys = list(effects)
    for name in sorted({k for t in result.trials for k in t.params}):
        verdict = "not compared (no two trials differ in it alone)"
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                da, db = dict(a), dict(b)
                if da.get(name) == db.get(name) or any(da.get(k) != db.get(k) for k in set(da) | set(db) if k != name):
                    continue
                if effects[a] != effects[b]:
                    verdict = "changed the executed run"
                    break
                verdict = "changed nothing in the executed run"
            if verdict == "changed the executed run":
                break
        by_who: dict[str, list[str]] = {}
        for value, who in sorted(ruled_out.get(name, {}).items()):
            by_who.setdefault(who, []).append(value)
        for who, values in by_who.items():
            verdict += f"; {', '.join(values)} not supported by {who} (not a tuning result)"
        out[name] = verdict
    return out
