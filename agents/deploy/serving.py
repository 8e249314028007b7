"""The deployment, exercised: for a validated port, the model the reference ran is saved as a servable
folder, the bundle's own serve.sh starts vLLM on it, and the server's greedy tokens and throughput are
checked against Transformers, all inside the sandbox (two runs: sandbox/serve_ref.py in the port's own
environment, sandbox/serve_client.py in the vLLM environment, where server and client share the sandbox's
loopback-only network).

:func:`exercise` returns the deployment record (deployment.json in the bundle); the report renders it.
"""

from __future__ import annotations

import json
import random
import socket
import sys
from pathlib import Path
from typing import Any

from agents.deploy.vllm import ASCEND_ONLY_ENV, ASCEND_ONLY_FLAGS
from agents.deploy.vllm_env import ensure_vllm_env, vllm_facts
from agents.request import request_of
from knowledge.errors import NpuportError
from sandbox.process import Limits, Mounts, default_sandbox, scrub, scrubbed_env
from sandbox.targets import target_spec_of

CONCURRENCIES = (1, 8, 32)
# Settings of serve.sh that only an Ascend host reads (agents/deploy/vllm.py); here present and not exercised.
# Both sides compute on THREADS CPU threads (vLLM's engine bound to cores 0..THREADS-1): like for like, and on a
# shared small host more OpenMP threads than free cores slow a small model down many times over.
THREADS = 1
HOST_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "VLLM_CPU_OMP_THREADS_BIND": "0" if THREADS == 1 else f"0-{THREADS - 1}"}
# Host-only additions: graph compilation takes minutes on a small CPU host, so this host serves eagerly.
HOST_ARGS = ["--enforce-eager"]


def workload(vocab: int, max_len: int, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """A serving workload of mixed prompt and output lengths (as ``vllm bench serve --dataset-name random``
    makes): prompt and output lengths uniform in [L/2, 3L/2], L = min(32, max_len / 4); random ids."""
    rng = random.Random(seed)
    base = max(4, min(32, max_len // 4))
    lo, hi = max(2, base // 2), base * 3 // 2
    top = max(vocab, 4)
    return [{"prompt": [rng.randrange(3, top) for _ in range(rng.randint(lo, hi))], "max_tokens": rng.randint(lo, hi)}
            for _ in range(n)]


def head_overrides(config: dict[str, Any], head_sizes: list[int]) -> tuple[dict[str, Any], str | None]:
    """Config changes that give the attention a head size vLLM's CPU attention implements (a tiny shrunk
    model may have head_dim 16); the reference is recomputed at that size, so the check stays like for like."""
    heads = int(config.get("num_attention_heads") or 0)
    hidden = int(config.get("hidden_size") or 0)
    if not heads or not hidden or not head_sizes:
        return {}, None
    hd = int(config.get("head_dim") or hidden // heads)
    if hd in head_sizes:
        return {}, None
    new = min((s for s in head_sizes if s >= hd), default=max(head_sizes))
    factor = new / hd
    out: dict[str, Any] = {"hidden_size": heads * new}
    if config.get("intermediate_size"):
        out["intermediate_size"] = int(config["intermediate_size"] * factor)
    if config.get("head_dim"):
        out["head_dim"] = new
    return out, (f"head_dim {hd} is not a head size vLLM's CPU attention implements ({head_sizes}): served and "
                 f"checked at head_dim {new} (hidden_size {heads * new}); the reference tokens are recomputed at that "
                 "size")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sandboxed(module: str, python: str, spec: dict[str, Any], run_dir: Path, ro: list[Path], wall_s: float,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    spec_path = run_dir / f"{module.rsplit('.', 1)[-1]}.spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    argv = [python, "-I", "-B", "-u", "-m", module, str(spec_path)]
    # vLLM maps its KV cache, shared memory and many threads: a larger address space than a harness run.
    limits = Limits(wall_s=wall_s, address_space_mb=64 * 1024, max_procs=1024)
    res = default_sandbox().execute(argv, cwd=run_dir, env=scrubbed_env(env), limits=limits,
                                    mounts=Mounts(ro=tuple(p.resolve() for p in ro), rw=(run_dir.resolve(),)),
                                    result_channel=True, channel_cap=64 * 2**20)
    (run_dir / f"{module.rsplit('.', 1)[-1]}.stderr.log").write_text(scrub(res.stderr)[-200_000:])
    try:
        out = json.loads(res.channel) if res.channel else {}
    except ValueError:
        out = {}
    if not out:
        tail = "\n".join(scrub(res.stderr).strip().splitlines()[-12:])
        out = {"ok": False, "error": f"{module} ended ({res.status}, code {res.returncode}) without a result: {tail}"}
    out["isolation"] = res.isolation
    return dict(out)


def _prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def match_rate(got: list[list[int]], want: list[list[int]]) -> float:
    """Tokens up to each row's first divergence, over the tokens wanted (after a divergence the two decode
    different contexts, so later positions say nothing)."""
    total = sum(len(w) for w in want)
    return sum(_prefix_len(g, w) for g, w in zip(got, want, strict=True)) / total if total else 1.0


def token_check(served: list[list[int]], refs: dict[str, list[list[int]]], dtype: str) -> dict[str, Any]:
    """The three-way comparison: Transformers float32, Transformers in the serving dtype, the server (in the
    serving dtype). Exact agreement with float32 passes; otherwise the server must stay within the
    reference's own drift in that dtype."""
    fp32, low = refs["float32"], refs.get(dtype) or refs["float32"]
    want = [w[:len(s)] if len(s) < len(w) else w for s, w in zip(served, fp32, strict=True)]
    rate_served, rate_ref = match_rate(served, want), match_rate(low, fp32)
    if served == want:
        verdict, ok = "exact: the server's greedy tokens equal Transformers float32", True
    elif served == low:
        verdict, ok = (f"equal to Transformers in {dtype} (Transformers' own {dtype} drift from float32: "
                       f"{rate_ref:.0%} match)"), True
    elif rate_served >= rate_ref:
        verdict, ok = (f"within the reference's {dtype} drift: {rate_served:.0%} of tokens match float32 before "
                       f"divergence, Transformers {dtype} itself {rate_ref:.0%}"), True
    else:
        verdict, ok = (f"mismatch: {rate_served:.0%} of tokens match float32, below Transformers {dtype}'s own "
                       f"{rate_ref:.0%}"), False
    return {"ok": ok, "verdict": verdict, "mode": "exact greedy tokens (no tokenizer: no logprobs compared)",
            "match_rate_served_vs_fp32": round(rate_served, 4), "match_rate_ref_dtype_vs_fp32": round(rate_ref, 4),
            "served": served, "reference_float32": fp32, f"reference_{dtype}": low}


def exercised_settings(settings: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(exercised, not exercised on this host) setting names of serve.sh / set_env.sh."""
    used, not_here = [], []
    for s in settings:
        name = s["name"]
        if s["kind"] == "additional_config" or name in ASCEND_ONLY_FLAGS or \
                (s["kind"] == "env" and name.startswith(ASCEND_ONLY_ENV)):
            why = ASCEND_ONLY_FLAGS.get(name, "read by vllm-ascend / CANN on an Ascend host")
            not_here.append(f"{name} ({why})")
        else:
            used.append(name)
    return used, not_here


def exercise(state: dict[str, Any], bundle: Path, run_root: Path, *, requests: int = 48,
             hf_single: int | None = None, concurrencies: tuple[int, ...] = CONCURRENCIES,
             start_timeout_s: float = 300.0, write_serve: Any = None, tune: Any = None) -> dict[str, Any]:
    """Serve the port with the bundle's serve.sh and check it; the deployment record (never raises for a
    model's failure: a server that does not start is a failed deployment with its own error). With tuning
    (``tune``, else the request's) and ``write_serve`` (re-renders the bundle's serve.sh with an engine
    configuration), the engine's knobs are tuned on the real engine afterwards (agents/deploy/engine_tune.py);
    a callable ``tune`` is handed the engine context instead (bench/record_engine_landscapes.py)."""
    from sandbox.shrink import shrink_config

    req = request_of(state)
    manifest = state.get("entry") or {}
    model_dir = Path(req.model_path).resolve()
    port_python = (state.get("environment") or {}).get("python")
    port_python = port_python if port_python and Path(port_python).exists() else sys.executable
    record: dict[str, Any] = {"status": "failed", "engine": "vllm-cpu", "host": "CPU (no NPU): vllm-cpu 0.32.0"}
    print("npuport: exercising the deployment: vLLM serves the port with serve.sh (NPUPORT_SERVE=0 skips it)",
          file=sys.stderr, flush=True)
    # On an Ascend host vLLM + vllm-ascend come with the NPU stack (the port's own environment); elsewhere
    # the cached vllm-cpu env serves. (The NPU branch has not run here: this host has no NPU.)
    on_npu = target_spec_of(state.get("target")).needs_device
    if on_npu:
        record.update(engine="vllm-ascend", host="Ascend NPU: the NPU stack's vllm + vllm-ascend")
    try:
        vpython = Path(port_python) if on_npu else ensure_vllm_env()
        facts = vllm_facts(vpython)
        if on_npu:
            facts["head_sizes"] = []  # the CPU attention's limits do not apply
    except NpuportError as exc:
        record["error"] = f"the vLLM environment could not be built: {exc}"
        return record
    config = json.loads((model_dir / str(manifest.get("config") or "config.json")).read_text())
    if req.shrink:
        config, _ = shrink_config(config, manifest.get("shrink") or {}, model_dir)
    overrides, note = head_overrides(config, facts["head_sizes"])
    config.update(overrides)
    max_len = int(config.get("max_position_embeddings") or 2048)
    work = workload(int(config.get("vocab_size") or 32000), max_len, requests)
    run_dir = run_root / "deploy"
    run_dir.mkdir(parents=True, exist_ok=True)
    servable = run_dir / "servable"
    dtype = "bfloat16"
    for s in json.loads((bundle / "deploy.json").read_text()).get("serve_settings") or []:
        if s["name"] == "dtype":
            dtype = str(s["value"])
    ref = _sandboxed("sandbox.serve_ref", port_python, {
        "model_dir": str(model_dir), "manifest": manifest, "shrink": req.shrink, "seed": 0,
        "config_overrides": overrides, "code_dir": str((bundle / "patched").resolve()),
        "servable_dir": str(servable.resolve()), "vllm_archs": facts["archs"], "dtype": dtype,
        "requests": work[:hf_single or requests], "batches": [1],
        "threads": THREADS, "batch_requests": work,
        "batch_sizes": [c for c in concurrencies if c > 1],
    }, run_dir, [model_dir, bundle / "patched"], 900)
    record.update(config_note=note, overrides=overrides, dtype=dtype, isolation=ref.get("isolation"))
    if not ref.get("ok"):
        failure = ref.get("exception") or {}
        record["error"] = ref.get("error") or f"the reference side failed: {failure.get('type')}: {failure.get('message')}"
        return record
    record["servable"] = ref["servable"]
    record["implementation"] = ref["servable"]["implementation"]
    if ref["servable"]["implementation"] == "none":
        record.update(status="no vLLM path", error=ref["servable"]["detail"])
        return record
    settings = json.loads((bundle / "deploy.json").read_text())["serve_settings"]
    record["exercised"], record["not_exercised"] = exercised_settings(settings)
    if on_npu:
        record["exercised"], record["not_exercised"] = [s["name"] for s in settings], []
    extra = [] if on_npu else [*HOST_ARGS]
    if not ref["servable"].get("tokenizer"):
        extra.append("--skip-tokenizer-init")  # prompts go in as token ids
    if ref["servable"]["implementation"] == "transformers-backend":
        extra += ["--model-impl", "transformers"]
    extra += ["--max-num-seqs", str(max(concurrencies))]
    env = {**({} if on_npu else HOST_ENV), "PATH": f"{vpython.parent}:/usr/local/bin:/usr/bin:/bin"}  # its `vllm`
    served_name = Path(req.model_path).name
    client = _sandboxed("sandbox.serve_client", str(vpython), {
        "serve_sh": str((bundle / "serve.sh").resolve()), "servable_dir": str(servable.resolve()),
        "serve_dir": str((run_dir / "serve_model").resolve()), "port": _free_port(), "extra_args": extra,
        "model_name": served_name, "prompts": ref["prompts"], "max_new_tokens": ref["max_new_tokens"],
        "logprobs": 5 if ref["servable"].get("tokenizer") else None, "requests": work,
        "concurrencies": list(concurrencies), "start_timeout_s": start_timeout_s, "log_path": str(run_dir / "server.log"),
    }, run_dir, [bundle], start_timeout_s + 900, env=env)
    record["host_args"] = extra
    record["host_env"] = {} if on_npu else HOST_ENV
    record["start_s"] = client.get("start_s")
    if not client.get("started"):
        record["error"] = "serve.sh did not start: " + str(client.get("error") or "")[-2500:]
        return record
    if not client.get("ok"):
        record["error"] = "the server started but the check failed: " + str(client.get("error") or "")[-2000:]
        return record
    served = [t["tokens"] for t in client["tokens"]]
    record["tokens"] = token_check(served, ref["reference_tokens"], dtype)
    record["throughput"] = throughput_table(client.get("bench") or [], ref.get("transformers") or [],
                                            ref.get("transformers_batched") or [])
    record.update(transformers=ref.get("transformers") or [], transformers_batched=ref.get("transformers_batched") or [],
                  threads=THREADS)
    record["status"] = "served" if record["tokens"]["ok"] else "failed"
    if not record["tokens"]["ok"]:
        record["error"] = f"tokens through the server: {record['tokens']['verdict']}"
    elif (req.tune if tune is None else tune) and not on_npu and (write_serve is not None or callable(tune)):
        from agents.deploy.engine_tune import engine_stage

        record["engine_tuning"] = engine_stage(
            run_dir, record, config, work, write_serve=write_serve, custom=tune if callable(tune) else None,
            run=_sandboxed, port=_free_port, python=str(vpython), ref_python=port_python, env=env, ro=[bundle],
            check=lambda served: token_check(served, ref["reference_tokens"], dtype),
            host_args=[*HOST_ARGS, "--max-num-seqs"], threads=THREADS, table=throughput_table)
    return record


def throughput_table(vllm_rows: list[dict[str, Any]], single: list[dict[str, Any]],
                     batched: list[dict[str, Any]]) -> dict[str, Any]:
    one = next((r["output_tokens_per_s"] for r in single if r["batch"] == 1), None)
    by_batch = {r["batch"]: r["output_tokens_per_s"] for r in batched}
    rows = []
    for r in vllm_rows:
        c = r["concurrency"]
        hf = by_batch.get(c, one if c == 1 else None)
        rows.append({**r, "transformers_batched_tok_s": hf,
                     "vs_one_at_a_time": round(r["output_tokens_per_s"] / one, 2) if one else None,
                     "vs_batched": round(r["output_tokens_per_s"] / hf, 2) if hf else None})
    return {"transformers_one_at_a_time_tok_s": one, "rows": rows}
