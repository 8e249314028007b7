"""Measure full grids (landscapes) of ocr_mini's port once, for bench/tuner_efficiency.py to replay.

    python bench/record_landscapes.py --port-dir BUNDLE/patched [--spaces cpu-batch-threads-attn ...]

``--port-dir`` is the patched tree of an ocr_mini port (a bundle's ``patched/`` folder; for
ascend-sim, the tree of a port to ascend-sim). Without it the port is made first through the graph
(``npuport`` on examples/ocr_mini). Each grid point is measured by sandbox/bench.py: tokens/s at
concurrency 8 (warm-up 1, repeats 2), and its first request's tokens are checked against the
original's (run under the cuda->cpu redirect in the same invocation).
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

from sandbox.bench import run_bench  # noqa: E402
from sandbox.process import Limits  # noqa: E402

EXAMPLE = ROOT / "examples" / "ocr_mini"
OUT = ROOT / "bench" / "landscapes"
CONCURRENCY = 8
CHUNK = 4  # configurations per sandbox process (a timeout loses only a chunk)

SPACES: dict[str, dict[str, Any]] = {
    "cpu-batch-threads-attn": {"target": "cpu", "dims": {"batch": [1, 2, 4, 8], "threads": [1, 2],
                                                         "attn": ["eager", "sdpa"]}, "fixed": {"dtype": "float32"}},
    "cpu-batch-dtype": {"target": "cpu", "dims": {"batch": [1, 2, 4, 8], "dtype": ["float32", "bfloat16", "float16"]},
                        "fixed": {"threads": 1, "attn": "sdpa"}},
    "cpu-batch32-threads-attn": {"target": "cpu", "concurrency": 32,
                                 "dims": {"batch": [1, 2, 4, 8, 16, 32], "threads": [1, 2], "attn": ["eager", "sdpa"]},
                                 "fixed": {"dtype": "float32"}},
    "ascend-sim-batch-attn-dtype": {"target": "ascend-sim", "chip": "910b",
                                    "dims": {"batch": [1, 2, 4, 8], "attn": ["eager", "sdpa"],
                                             "dtype": ["float32", "float16"]}, "fixed": {}},
}


def _target(name: str, chip: str) -> tuple[str, dict[str, Any] | None, dict[str, str]]:
    from sandbox.targets import resolve_target

    t = resolve_target(name, chip=chip)
    return t.device, (t.harness_target() if t.bootstrap else None), dict(t.env)


def baseline(manifest: dict[str, Any], work: Path) -> dict[str, Any]:
    run = run_bench(workdir=work, model_dir=EXAMPLE, run_dir=work / "baseline", manifest=manifest,
                    configs=[{"id": "baseline", "batch": 1}], device="cuda", redirect="cuda->cpu",
                    concurrencies=[CONCURRENCY], warmup=1, repeats=2, limits=Limits(wall_s=1200))
    if not run.ok:
        raise SystemExit(f"the original could not be benchmarked: {run.error()}")
    return run.result["configs"][0]


def record(name: str, port_dir: Path, manifest: dict[str, Any], ref_tokens: list[list[int]], work: Path) -> dict[str, Any]:
    space = SPACES[name]
    conc = int(space.get("concurrency", CONCURRENCY))
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
                        warmup=1, repeats=2, reference_tokens=ref_tokens, limits=Limits(wall_s=1500))
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
    return {"schema": 1, "name": name, "model": "ocr_mini", "target": space["target"], "chip": space.get("chip"),
            "objective": f"new tokens/s at concurrency {conc} (median of 2 repeats after 1 warm-up)",
            "dims": space["dims"], "fixed": space["fixed"], "points": points,
            "host": {"machine": platform.machine(), "python": platform.python_version(),
                     "cores": len(__import__("os").sched_getaffinity(0))},
            "port_note": f"patched tree given as {port_dir.name}", "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def make_port(work: Path, target: str) -> Path:
    from graph.runner import run_port

    state = run_port({"request": {"model_path": str(EXAMPLE), "target": target, "out_dir": str(work / "bundle")}},
                     f"landscape-{target}-{int(time.time())}")
    if state.get("status") != "validated":
        raise SystemExit(f"the port did not validate: {state.get('reason')}")
    return work / "bundle" / "patched"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port-dir", type=Path, help="patched tree of the cpu port")
    ap.add_argument("--sim-port-dir", type=Path, help="patched tree of the ascend-sim port")
    ap.add_argument("--spaces", nargs="*", default=list(SPACES))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    manifest = yaml.safe_load((EXAMPLE / "npuport.yaml").read_text())
    work = Path(tempfile.mkdtemp(prefix="npuport-landscapes-"))
    base = baseline(manifest, work)
    ref = base.get("tokens") or []
    print(f"original as written: {base['points'][0]['tokens_per_s']:.2f} tokens/s at concurrency {CONCURRENCY}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.spaces:
        target = SPACES[name]["target"]
        port = args.sim_port_dir if target == "ascend-sim" else args.port_dir
        port = (port or make_port(work, target)).resolve()
        data = record(name, port, manifest, ref, work)
        data["baseline_tokens_per_s"] = base["points"][0]["tokens_per_s"]
        (args.out / f"{name}.json").write_text(json.dumps(data, indent=1))
        ok = [p for p in data["points"] if p["value"]]
        best = max(ok, key=lambda p: p["value"]) if ok else None
        print(f"{name}: {len(ok)}/{len(data['points'])} points ran; best {best and best['params']} "
              f"{best and round(best['value'], 2)} tokens/s", flush=True)


if __name__ == "__main__":
    main()
