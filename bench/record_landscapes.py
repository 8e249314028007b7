"""Measure full grids (landscapes) of a model's port once, for bench/tuner_efficiency.py to replay.

    python bench/record_landscapes.py [--model examples/tiny_llm | --model tiny-fixture]
        [--port-dir BUNDLE/patched] [--spaces cpu-batch-threads-attn ...]

``--model`` is the original model folder (default examples/ocr_mini); ``tiny-fixture`` is the tiny
embedding + linear model of tests/tiny_models.py, written to a temporary folder (a third shape).
``--port-dir`` is the patched tree of a port of that model (a bundle's ``patched/`` folder; for
ascend-sim, the tree of a port to ascend-sim). Without it the port is made first through the graph.
Each grid point is measured by sandbox/bench/throughput.py: tokens/s at concurrency 8 (the space's, or
``--concurrency``; warm-up 1, ``--repeats`` 2), and its first request's tokens are checked against the
original's (run under the cuda->cpu redirect in the same invocation, in the environment the graph
resolved for the model when it made the port). Files are written as ``<space>.json`` for ocr_mini (the first recordings)
and ``<model>--<space>.json`` for other models.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox.bench.runner import run_bench  # noqa: E402
from sandbox.isolation.process import Limits  # noqa: E402

EXAMPLE = ROOT / "examples" / "ocr_mini"
OUT = ROOT / "bench" / "landscapes"
CONCURRENCY = 8
REPEATS = 2
CHUNK = 4  # configurations per sandbox process (a timeout loses only a chunk)

SPACES: dict[str, dict[str, Any]] = {
    "cpu-batch-threads-attn": {"target": "cpu", "dims": {"batch": [1, 2, 4, 8], "threads": [1, 2],
                                                         "attn": ["eager", "sdpa"]}, "fixed": {"dtype": "float32"}},
    "cpu-batch-dtype": {"target": "cpu", "dims": {"batch": [1, 2, 4, 8], "dtype": ["float32", "bfloat16", "float16"]},
                        "fixed": {"threads": 1, "attn": "sdpa"}},
    "cpu-batch32-threads-attn": {"target": "cpu", "concurrency": 32,
                                 "dims": {"batch": [1, 2, 4, 8, 16, 32], "threads": [1, 2], "attn": ["eager", "sdpa"]},
                                 "fixed": {"dtype": "float32"}},
    # For models without an attention-implementation switch (the knob would be a no-op).
    "cpu-batch-threads-dtype": {"target": "cpu", "dims": {"batch": [1, 2, 4, 8], "threads": [1, 2],
                                                          "dtype": ["float32", "bfloat16"]}, "fixed": {}},
    "ascend-sim-batch-attn-dtype": {"target": "ascend-sim", "chip": "910b",
                                    "dims": {"batch": [1, 2, 4, 8], "attn": ["eager", "sdpa"],
                                             "dtype": ["float32", "float16"]}, "fixed": {}},
}


def _target(name: str, chip: str) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
    from sandbox.targets import resolve_target

    t = resolve_target(name, chip=chip)
    return t.device, (t.harness_target() if t.bootstrap else None), dict(t.env)


def baseline(model_dir: Path, manifest: dict[str, Any], work: Path, python: str | None) -> dict[str, Any] | None:
    """The original as written, under the cuda->cpu redirect; None when it cannot run in this
    environment (e.g. it needs an older transformers than the one installed here)."""
    run = run_bench(workdir=work, model_dir=model_dir, run_dir=work / "baseline", manifest=manifest,
                    configs=[{"id": "baseline", "batch": 1}], device="cuda", redirect="cuda->cpu",
                    concurrencies=[CONCURRENCY], warmup=1, repeats=2, limits=Limits(wall_s=1200), python=python)
    if not run.ok:
        print(f"the original could not be benchmarked here: {run.error()}", flush=True)
        return None
    return dict(run.result["configs"][0])


def port_reference(port_dir: Path, manifest: dict[str, Any], work: Path, python: str | None) -> list[list[int]]:
    """Reference tokens from the port at batch 1 in float32 on cpu, used when the original cannot
    run here (the graph validated the port's greedy tokens against the original in its own env)."""
    run = run_bench(workdir=work, model_dir=port_dir, run_dir=work / "port-reference", manifest=manifest,
                    configs=[{"id": "reference", "batch": 1, "dtype": "float32"}], device="cpu",
                    concurrencies=[CONCURRENCY], warmup=0, repeats=1, limits=Limits(wall_s=1200), python=python)
    if not run.ok:
        raise SystemExit(f"neither the original nor the port could be benchmarked: {run.error()}")
    return list(run.result["configs"][0].get("tokens") or [])


def record(name: str, model: str, port_dir: Path, manifest: dict[str, Any], ref_tokens: list[list[int]], work: Path,
           python: str | None = None, concurrency: int | None = None, repeats: int = REPEATS) -> dict[str, Any]:
    space = SPACES[name]
    conc = concurrency or int(space.get("concurrency", CONCURRENCY))
    device, target, env = _target(space["target"], space.get("chip", "910b"))
    names = list(space["dims"])
    grid = [{**space["fixed"], **dict(zip(names, combo, strict=True))}
            for combo in itertools.product(*space["dims"].values())]
    points: list[dict[str, Any]] = []
    for i in range(0, len(grid), CHUNK):
        chunk = [{"id": f"p{i + j}", **p} for j, p in enumerate(grid[i:i + CHUNK])]
        t0 = time.time()
        run = run_bench(workdir=work, model_dir=port_dir, run_dir=work / name / f"chunk{i}", manifest=manifest,
                        configs=chunk, device=device, target=target, env=env, concurrencies=[conc],
                        warmup=1, repeats=repeats, reference_tokens=ref_tokens, limits=Limits(wall_s=1500),
                        python=python)
        by_id = {c["id"]: c for c in run.result.get("configs") or []}
        for cfg in chunk:
            c = by_id.get(cfg["id"])
            params = {k: cfg[k] for k in names}
            if c is None:
                points.append({"params": params, "status": "error", "value": None, "runs": [], "detail": run.error()})
                continue
            pt = (c.get("points") or [{}])[0]
            ok = c["status"] == "ok"
            points.append({"params": params, "status": c["status"], "value": pt.get("tokens_per_s") if ok else None,
                           "runs": pt.get("tokens_per_s_runs", []) if ok else [], "spread": pt.get("spread"),
                           "latency_p50_s": pt.get("latency_p50_s"), "detail": c.get("detail", "")[:300]})
        print(f"{name}: {min(i + CHUNK, len(grid))}/{len(grid)} points ({time.time() - t0:.0f} s)", flush=True)
    return {"schema": 1, "name": name, "model": model, "target": space["target"], "chip": space.get("chip"),
            "objective": f"new tokens/s at concurrency {conc} (median of {repeats} repeats after 1 warm-up)",
            "dims": space["dims"], "fixed": space["fixed"], "points": points,
            "host": {"machine": platform.machine(), "python": platform.python_version(),
                     "cores": len(__import__("os").sched_getaffinity(0))},
            "port_note": f"patched tree given as {port_dir.name}", "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def make_port(model_dir: Path, work: Path, target: str) -> tuple[Path, str | None]:
    """Port through the graph; the patched tree and the python of the environment the graph resolved
    for the model (None: this venv's)."""
    from graph.runner import run_port

    state = run_port({"request": {"model_path": str(model_dir), "target": target,
                                  "out_dir": str(work / f"bundle-{target}")}},
                     f"landscape-{target}-{int(time.time())}")
    if state.get("status") != "validated":
        raise SystemExit(f"the port did not validate: {state.get('reason')}")
    return work / f"bundle-{target}" / "patched", (state.get("environment") or {}).get("python")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(EXAMPLE),
                    help="original model folder, or 'tiny-fixture' (tests/tiny_models.py)")
    ap.add_argument("--port-dir", type=Path, help="patched tree of the cpu port")
    ap.add_argument("--sim-port-dir", type=Path, help="patched tree of the ascend-sim port")
    ap.add_argument("--spaces", nargs="*", default=list(SPACES))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--concurrency", type=int, help="requests per measurement (default: the space's, else 8); "
                    "tiny models need more for a measurement above the timer noise")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npuport-landscapes-"))
    if args.model == "tiny-fixture":
        from tests.tiny_models import write_tiny_model

        model_dir = write_tiny_model(work / "tiny-fixture")
    else:
        model_dir = Path(args.model).resolve()
    manifest = yaml.safe_load((model_dir / "npuport.yaml").read_text())
    model = str(manifest.get("name") or model_dir.name)
    ports: dict[str, tuple[Path, str | None]] = {}
    for name in args.spaces:  # ports first: the original runs in the environment the graph resolved for it
        target = SPACES[name]["target"]
        given = args.sim_port_dir if target == "ascend-sim" else args.port_dir
        if target not in ports:
            ports[target] = (given.resolve(), None) if given else make_port(model_dir, work, target)
    python = next((py for _, py in ports.values() if py), None)
    base = baseline(model_dir, manifest, work, python)
    base_tps = base["points"][0]["tokens_per_s"] if base else None
    if base:
        print(f"original as written: {base_tps:.2f} tokens/s at concurrency {CONCURRENCY}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.spaces:
        target = SPACES[name]["target"]
        given = args.sim_port_dir if target == "ascend-sim" else args.port_dir
        port, py = ports[target]
        if base and base.get("tokens"):
            ref = base["tokens"]
        else:
            ref_port, ref_py = ports.get("cpu", ports[target])
            ref = port_reference(ref_port, manifest, work, ref_py)
        data = record(name, model, port, manifest, ref, work, py, args.concurrency, args.repeats)
        data["recorded_with"] = " ".join(["python", "bench/record_landscapes.py", *sys.argv[1:]])
        data["baseline_tokens_per_s"] = base_tps
        data["environment_python"] = "resolved by the graph" if py else "this venv"
        data["token_reference"] = ("the original under the cuda->cpu redirect" if base else
                                   "the port at batch 1, float32 on cpu (the original did not run here; the graph "
                                   "validated the port's greedy tokens against it)")
        if not given:
            data["port_note"] = f"port made by the graph (graph.runner.run_port, target {target})"
        stem = name if model == "ocr_mini" else f"{model}--{name}"
        (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1))
        ok = [p for p in data["points"] if p["value"]]
        best = max(ok, key=lambda p: p["value"]) if ok else None
        print(f"{name}: {len(ok)}/{len(data['points'])} points ran; best {best and best['params']} "
              f"{best and round(best['value'], 2)} tokens/s", flush=True)


if __name__ == "__main__":
    main()
