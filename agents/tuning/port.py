"""Tuning a validated port: budgets, the model's facts, the search space and the search, measured in the sandbox."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from agents import progress
from agents.models import TrialRecord, Tuning
from agents.target_state import target_from_dict
from agents.tuning.constraints import NoFeasiblePoint, constraints_for, prune
from agents.tuning.measure import REPORT_CONCURRENCIES, TUNE_CONCURRENCY, PortBench, at, points_of
from agents.tuning.search import Budget, Evaluate, TuneResult, npuport_search
from agents.tuning.space import HostFacts, SearchSpace, model_facts, torch_space
from agents.workspace import Workspace
from knowledge.settings import settings

DEFAULT_TRIALS = 12


def budget_of(req: dict[str, Any]) -> Budget:
    """Trials and seconds for the search: the request's ``tune_trials`` / ``tune_time_s`` when given,
    else NPUPORT_TUNE_TRIALS / NPUPORT_TUNE_TIME_S, else 12 trials and half the port's wall budget."""
    conf = settings()
    trials = req.get("tune_trials") or conf.tune_trials or DEFAULT_TRIALS
    secs = req.get("tune_time_s") or conf.tune_time_s or float(req.get("max_wall_s", 1800)) / 2
    return Budget(max_trials=int(trials), max_seconds=float(secs))


def facts_of(state: dict[str, Any]) -> HostFacts:
    req = state["request"]
    manifest = state.get("entry") or {}
    model_dir = Path(state["workdir"]) / "model"
    config_path = model_dir / manifest.get("config", "config.json")
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    facts = model_facts(config, has_custom_code=any(model_dir.glob("*.py")))
    ref = (state.get("numerics") or {}).get("reference_tokens") or [[]]
    facts.new_tokens = max(1, len(ref[0]))
    return HostFacts(target=state["target"]["name"], chip=req.get("chip", "910b"), model=facts)


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


def llm_proposals(state: dict[str, Any], space: SearchSpace, facts: HostFacts) -> tuple[list[dict[str, Any]], str]:
    """The LLM tuner's proposals (policy llm/hybrid with an endpoint), kept only when they are points of
    the constraint-pruned space; the note says how many were proposed, kept and rejected."""
    from agents.policies.assist import llm_enabled, propose_trials
    from agents.policies.base import policy_context

    req = state.get("request") or {}
    if not llm_enabled(req.get("policy")):
        return [], ""
    feasible, _pruned = prune(space, facts, constraints_for(space))
    keys = {space.key(p) for p in feasible}
    start = {d.name: d.start() for d in space.dims}
    values = {d.name: list(d.values) for d in space.dims}
    proposed, note = propose_trials(policy_context(state), values, [], str(req.get("objective", "throughput")))
    kept = [p for p in proposed if space.key({**start, **p}) in keys]
    if proposed:
        note += f"; {len(kept)} inside the constraint space, {len(proposed) - len(kept)} rejected (pruned by constraints)"
        from agents.policies.reasoning import think

        think("tuner", "llm", note + "; the optimiser measures them and judges")
    return kept, note


def search(space: SearchSpace, facts: HostFacts, evaluate: Evaluate, budget: Budget,
           proposals: list[dict[str, Any]] | None = None) -> tuple[Tuning, TuneResult | None]:
    """Run the search; an empty feasible space ends with status failed and the reason, nothing run."""
    try:
        result = npuport_search(space, facts, evaluate, budget, proposals=proposals)
    except NoFeasiblePoint as exc:
        return Tuning(status="failed", detail=str(exc)), None
    tuning = Tuning(status="done" if result.best else "failed", trials=trial_records(result))
    if result.best is None:
        tuning.detail = f"no trial ran successfully ({len(result.trials)} tried; {result.stopped})"
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
        progress.emit("trial_done", k=k, n=n, params=params, value=outcome.value, outcome=outcome.status)
        return outcome

    return run


def fmt_params(params: dict[str, Any] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (params or {}).items()) or "-"


def skeleton_tuning(state: dict[str, Any]) -> Tuning:
    runs = state.get("runs") or []
    port = next((r for r in reversed(runs) if r["purpose"] == "port" and r["ok"]), None)
    ref = next((r for r in runs if r["purpose"] == "reference" and r["ok"]), None)
    tuning = Tuning(status="skipped", detail="tuning not requested; timings recorded from the validation runs")
    if port:
        tuning.tuned = {"run_s": (port.get("timings") or {}).get("run_s"), "target": port["target"]}
    if ref:
        tuning.baseline = {"run_s": (ref.get("timings") or {}).get("run_s"), "target": ref["target"]}
    return tuning


def tune_port(state: dict[str, Any], space: SearchSpace | None = None) -> Tuning:
    req = state["request"]
    ws = Workspace(Path(state["workdir"]))
    original = ws.root / "original"
    ws.original_tree(original)
    target = target_from_dict(state["target"])
    facts = facts_of(state)
    space = space or space_for(facts)
    ref_tokens = (state.get("numerics") or {}).get("reference_tokens")
    bench = PortBench(workdir=ws.root, model_dir=ws.model_dir, original_dir=original, manifest=state["entry"],
                      target=target, runs_dir=ws.runs_dir / "tuning", reference_tokens=ref_tokens,
                      wall_s=float(req.get("run_timeout_s", 300)) * 2,
                      python=(state.get("environment") or {}).get("python"), shrink=bool(req.get("shrink")))
    t0 = time.monotonic()
    budget = budget_of(req)
    proposals, llm_note = llm_proposals(state, space, facts)
    tuning, result = search(space, facts, _reporting(bench.evaluator(), budget.max_trials), budget, proposals)
    if llm_note:
        tuning.detail = f"{tuning.detail}; {llm_note}" if tuning.detail else llm_note
    if result is None or not tuning.best:
        return tuning
    # Final measurements, same host, back to back: the tuned port and the original as written.
    progress.emit("phase", text="final benchmark: the tuned port, then the original")
    tuned_run = bench.port([{"id": "tuned", **tuning.best}], REPORT_CONCURRENCIES, "bench-tuned")
    # The original serves one request at a time: its tokens/s hardly depends on concurrency, and each
    # point costs concurrency x (warm-up + repeats) slow generations, so two points suffice.
    base_run = bench.baseline(sorted({1, TUNE_CONCURRENCY}))
    tuned_pts, base_pts = points_of(tuned_run), points_of(base_run)
    host = {"machine": platform.machine(), "cores": facts.cores, "processor": platform.processor() or platform.machine()}
    tuning.baseline = {"what": "original as written, eager, batch 1, cuda->cpu redirect, CPU float32",
                       "config": {"batch": 1}, "target": "cpu (cuda->cpu redirect)", "points": base_pts,
                       "tokens_per_s": at(base_pts, TUNE_CONCURRENCY),
                       "error": "" if base_run.ok else base_run.error()}
    tuned_tps = at(tuned_pts, TUNE_CONCURRENCY)
    base_tps = tuning.baseline["tokens_per_s"]
    tuning.tuned = {"config": tuning.best, "target": target.name, "points": tuned_pts, "tokens_per_s": tuned_tps,
                    "concurrency": TUNE_CONCURRENCY, "speedup": (tuned_tps / base_tps) if tuned_tps and base_tps else None,
                    "space": space.name, "stopped": result.stopped, "feasible_points": result.feasible,
                    "pruned_points": result.pruned, "search_s": round(time.monotonic() - t0, 1), "host": host,
                    "measured_on": f"{target.name} on this host ({host['machine']}, {host['cores']} cores)",
                    "error": "" if tuned_run.ok else tuned_run.error()}
    speed = f"{tuning.tuned['speedup']:.1f}x" if tuning.tuned["speedup"] else "n/a"
    tuning.detail = (f"{len(tuning.trials)} trials ({result.stopped}); best {fmt_params(tuning.best)}: "
                     f"{tuned_tps or 0:.1f} tokens/s vs original {base_tps or 0:.1f} at concurrency {TUNE_CONCURRENCY} "
                     f"({speed})" + (f"; {llm_note}" if llm_note else ""))
    return tuning
