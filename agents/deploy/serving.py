"""The deployment, exercised: for a validated port, the model the reference ran is saved as a servable
folder, the bundle's own serve.sh starts vLLM on it, and the server's greedy tokens and throughput are
checked against Transformers, all inside the sandbox (two runs: sandbox/serving/reference.py in the port's own
environment, sandbox/serving/client.py in the vLLM environment, where server and client share the sandbox's
loopback-only network).

:func:`exercise` returns the deployment record (deployment.json in the bundle); the report renders it.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from agents.deploy.token_gate import prefix_len, token_check
from agents.deploy.vllm import ASCEND_ONLY_ENV, ASCEND_ONLY_FLAGS
from agents.deploy.vllm_env import ensure_vllm_env, vllm_facts
from agents.deploy.vllm_vision import ensure_vision_overlay
from agents.request import request_of
from knowledge.errors import NpuportError
from sandbox.isolation.process import Limits, Mounts, default_sandbox, scrub, scrubbed_env
from sandbox.isolation.rundir import write_own
from sandbox.targets import target_spec_of

CONCURRENCIES = (1, 8, 32)
TOP_K = 5  # logprobs per position compared through the server
# Transformers one request at a time is timed on the first HF_SINGLE requests of the workload (the slowest
# measurement of the check; a rate needs no more), batched on all of them; vLLM serves all at every concurrency.
HF_SINGLE = 12
# An image request runs the model's vision encoder on the CPU: its workload is the first IMAGE_REQUESTS requests.
IMAGE_REQUESTS = 8
# Settings of serve.sh that only an Ascend host reads (agents/deploy/vllm.py); here present and not exercised.
# Both sides compute on THREADS CPU threads (vLLM's engine bound to cores 0..THREADS-1): like for like, and on a
# shared small host more OpenMP threads than free cores slow a small model down many times over.
THREADS = 1
# Implementations that run vLLM's own classes (not the patched code): when one fails the model, the Transformers
# backend over the patched code is tried (sandbox/serving/export.py).
VLLM_CLASSES = ("vllm-native", "vllm-native-layout")
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
    model may have head_dim 16); the reference is recomputed at that size, so the check stays like for like.
    An explicit head size (``head_dim``, or ``kv_channels`` as GLM configs name it) is changed in place; a
    derived one (hidden_size / heads) through the width, heads kept."""
    heads = int(config.get("num_attention_heads") or 0)
    hidden = int(config.get("hidden_size") or 0)
    if not heads or not hidden or not head_sizes:
        return {}, None
    key = next((k for k in ("head_dim", "kv_channels") if config.get(k)), None)
    hd = int(config[key]) if key else hidden // heads
    if hd in head_sizes:
        return {}, None
    new = min((s for s in head_sizes if s >= hd), default=max(head_sizes))
    factor = new / hd
    out: dict[str, Any] = {"hidden_size": heads * new}
    for width in ("intermediate_size", "ffn_hidden_size"):
        if config.get(width):
            out[width] = int(config[width] * factor)
    if key:
        out[key] = new
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
    write_own(spec_path, json.dumps(spec, indent=1))  # the run folder is the runs' too: never through their links
    argv = [python, "-I", "-B", "-u", "-m", module, str(spec_path)]
    # vLLM maps its KV cache, shared memory and many threads: a larger address space than a harness run.
    limits = Limits(wall_s=wall_s, address_space_mb=64 * 1024, max_procs=1024)
    res = default_sandbox().execute(argv, cwd=run_dir, env=scrubbed_env(env), limits=limits,
                                    mounts=Mounts(ro=tuple(p.resolve() for p in ro), rw=(run_dir.resolve(),)),
                                    result_channel=True, channel_cap=64 * 2**20)
    write_own(run_dir / f"{module.rsplit('.', 1)[-1]}.stderr.log", scrub(res.stderr)[-200_000:])
    try:
        out = json.loads(res.channel) if res.channel else {}
    except ValueError:
        out = {}
    if not out:
        tail = "\n".join(scrub(res.stderr).strip().splitlines()[-12:])
        out = {"ok": False, "error": f"{module} ended ({res.status}, code {res.returncode}) without a result: {tail}"}
    out["isolation"] = res.isolation
    return dict(out)


def _why(client: dict[str, Any], tail: int) -> str:
    """The client's failure: the server log's root cause first (sandbox/serve_client.root_cause), then its tail."""
    cause, log = client.get("cause"), str(client.get("error") or "")[-tail:]
    return f"{cause}\n--- the server's log, last lines ---\n{log}" if cause else log


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


def plugin_note(config: dict[str, Any], facts: dict[str, Any]) -> str:
    """For a model with no vLLM path here: when this vLLM names its architecture as served by an out-of-tree
    plugin (its registry's table, read by vllm_facts), where that plugin is; else nothing."""
    arch = next(iter(config.get("architectures") or []), None)
    url = (facts.get("plugins") or {}).get(arch) if arch else None
    return (f". vLLM serves {arch} only through an out-of-tree plugin, {url}, not installed here: installed "
            "beside vLLM (and vllm-ascend on an Ascend host) it would be the path to try" if url else "")


def reference_model_dir(state: dict[str, Any], model_dir: Path) -> Path:
    """The folder the Transformers side builds the original from: the original as written, or, when
    validation needed the switch-only fixes to build it at all (agents/validation/reference.py), the
    workspace's adjusted reference copy (as written it fails here the same way)."""
    workdir = state.get("workdir")
    runs = state.get("runs") or []
    if not workdir or not Path(workdir).is_dir() or not any(r.get("reference_adjusted") for r in runs):
        return model_dir
    from agents.validation.reference import reference_copy
    from agents.workspace import Workspace

    return reference_copy(Workspace(Path(workdir)), runs).resolve()


def exercise(state: dict[str, Any], bundle: Path, run_root: Path, *, requests: int = 48,
             hf_single: int | None = HF_SINGLE, concurrencies: tuple[int, ...] = CONCURRENCIES,
             start_timeout_s: float = 900.0, throughput_budget_s: float = 480.0, write_serve: Any = None,
             tune: Any = None, image_requests: int | None = IMAGE_REQUESTS) -> dict[str, Any]:
    """Serve the port with the bundle's serve.sh and check it; the deployment record (never raises for a
    model's failure: a server that does not start is a failed deployment with its own error). With tuning
    (``tune``, else the request's) and ``write_serve`` (re-renders the bundle's serve.sh with an engine
    configuration), the engine's knobs are tuned on the real engine afterwards (agents/deploy/engine_tune.py);
    a callable ``tune`` is handed the engine context instead (bench/record_engine_landscapes.py). An image
    model's load is its first ``image_requests`` requests at the concurrencies up to that (None: the whole
    workload at every concurrency, as a text model's: bench/serve_speedup.py)."""
    from knowledge.untrusted import read_model_config
    from sandbox.harness.shrink import shrink_config

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
    config = read_model_config(model_dir, manifest)  # knowledge/untrusted.py: inside the model's folder only
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
    ref_dir = reference_model_dir(state, model_dir)
    ref_spec = {
        "model_dir": str(ref_dir), "manifest": manifest, "shrink": req.shrink, "seed": 0,
        "config_overrides": overrides, "code_dir": str((bundle / "patched").resolve()),
        "servable_dir": str(servable.resolve()), "vllm_archs": facts["archs"], "dtype": dtype,
        "vllm_model_types": facts.get("model_types") or [],
        "requests": work[:hf_single or requests], "batches": [1],
        "threads": THREADS, "batch_requests": work,
        "batch_sizes": [c for c in concurrencies if c > 1], "throughput_budget_s": throughput_budget_s,
        "image_requests": image_requests,
    }
    ref = _sandboxed("sandbox.serving.reference", port_python, ref_spec, run_dir,
                     list(dict.fromkeys([model_dir, ref_dir, bundle / "patched"])), 900 + throughput_budget_s)
    record.update(config_note=note, overrides=overrides, dtype=dtype, isolation=ref.get("isolation"),
                  reference_phases_s=ref.get("phases"))
    if not ref.get("ok"):
        failure = ref.get("exception") or {}
        record["error"] = ref.get("error") or f"the reference side failed: {failure.get('type')}: {failure.get('message')}"
        return record
    record["servable"] = ref["servable"]
    record["implementation"] = ref["servable"]["implementation"]
    if ref["servable"]["implementation"] == "none":
        record.update(status="no vLLM path", error=ref["servable"]["detail"] + plugin_note(config, facts))
        return record
    if ref.get("not_driven"):  # vLLM could load it, but the check cannot build the request: nothing claimed
        record.update(status="not served", error=ref["not_driven"])
        return record
    settings = json.loads((bundle / "deploy.json").read_text())["serve_settings"]
    record["exercised"], record["not_exercised"] = exercised_settings(settings)
    if on_npu:
        record["exercised"], record["not_exercised"] = [s["name"] for s in settings], []
    image = ref.get("image_request")
    if image is not None and image_requests:
        work, concurrencies = work[:image_requests], tuple(c for c in concurrencies if c <= image_requests) or (1,)
    if image is not None:
        record["image_request"] = {k: image[k] for k in ("text", "placeholder", "tokenizer", "chat_template")}
        # vLLM profiles its vision encoder on a large dummy image at start-up, and every request runs it: on a
        # CPU that takes several times a text model's start and requests.
        start_timeout_s *= 2
    env = {**({} if on_npu else HOST_ENV), "PATH": f"{vpython.parent}:/usr/local/bin:/usr/bin:/bin"}  # its `vllm`
    readable = [bundle]
    if image is not None and not on_npu:  # vLLM's image processors import torchvision (agents/deploy/vllm_vision.py)
        try:
            vision = ensure_vision_overlay(vpython)
        except NpuportError as exc:
            record["error"] = f"no torchvision loads in the vLLM env for its image processor: {exc}"
            return record
        record["torchvision"] = vision
        env["PYTHONPATH"] = vision["path"]
        readable.append(Path(vision["path"]))
    if image is not None:
        # In a folder of its own, which every server start reads (the engine tuner's trials too); made afresh
        # (mkdtemp: a name no run could have taken) while no sandboxed run is going.
        template = Path(tempfile.mkdtemp(prefix="chat-template-", dir=run_dir)) / "npuport-chat-template.jinja"
        write_own(template, image["chat_template"])
        readable.append(template.parent)

    def serve_on(servable_info: dict[str, Any], servable_dir: Path, retry: bool = False) -> dict[str, Any] | None:
        """Start serve.sh on one servable folder and check its tokens; the client's result, or None with
        the failure in the record (``retry``: the backend after a vLLM class failed the model)."""
        extra = [] if on_npu else [*HOST_ARGS]
        if not servable_info.get("tokenizer"):
            extra.append("--skip-tokenizer-init")  # prompts go in as token ids
        if servable_info["implementation"] == "transformers-backend":
            extra += ["--model-impl", "transformers"]
        extra += ["--max-num-seqs", str(max(concurrencies))]
        if image is not None:
            extra += ["--chat-template", str(template.resolve())]
        client = _sandboxed("sandbox.serving.client", str(vpython), {
            "serve_sh": str((bundle / "serve.sh").resolve()), "servable_dir": str(servable_dir.resolve()),
            "serve_dir": str((run_dir / "serve_model").resolve()), "port": _free_port(), "extra_args": extra,
            "model_name": Path(req.model_path).name, "prompts": ref["prompts"], "max_new_tokens": ref["max_new_tokens"],
            "logprobs": TOP_K if ref.get("reference_logprobs") else None, "requests": work,
            "concurrencies": list(concurrencies), "start_timeout_s": start_timeout_s,
            "log_path": str(run_dir / "server.log"), "image_request": image,
            "check_backend": servable_info["implementation"] == "transformers-backend",
        }, run_dir, readable, start_timeout_s + (2400 if image is not None else 900), env=env)
        record.update(servable=servable_info, implementation=servable_info["implementation"])
        if client.get("no_path"):
            record.update(status="no vLLM path", implementation="none", error=client["no_path"] + (
                "" if retry else "; the weights have no layout of a vLLM class either") + plugin_note(config, facts))
            return None
        record.update(host_args=extra, host_env={} if on_npu else HOST_ENV, start_s=client.get("start_s"))
        if not client.get("started"):
            record["error"] = "serve.sh did not start: " + _why(client, 2500)
            return None
        if not client.get("ok"):
            record["error"] = "the server started but the check failed: " + _why(client, 2000)
            return None
        if image is not None:
            got, want = client["tokens"][0].get("prompt_ids") or [], ref["prompts"][0]
            same = got == want
            record["prompt_check"] = {"same": same, "served_len": len(got), "reference_len": len(want),
                                      "first_difference": None if same else prefix_len(got, want)}
            if not same:
                record["error"] = (f"the server built another prompt from the image request than the reference's: "
                                   f"{len(got)} ids vs {len(want)}, first difference at {prefix_len(got, want)}; its "
                                   "tokens are not comparable")
                return None
        served = [t["tokens"] for t in client["tokens"]]
        served_lps = [t.get("top_logprobs") for t in client["tokens"]]
        record["tokens"] = token_check(served, ref["reference_tokens"], dtype,
                                       served_lps if all(served_lps) else None, ref.get("reference_logprobs"),
                                       ref.get("logprobs_note") or (None if all(served_lps) else
                                                                    "the server returned no top-k logprobs"))
        if not record["tokens"]["ok"]:
            record["error"] = f"tokens through the server: {record['tokens']['verdict']}"
            return None
        return client

    client = serve_on(ref["servable"], servable)
    if client is None and ref["servable"]["implementation"] in VLLM_CLASSES and record.get("status") != "no vLLM path":
        # vLLM's class for the model crashed or computed other tokens (its CPU kernels have their own limits): the
        # Transformers backend runs the patched code instead, when the model is a class it can take.
        first = {"implementation": ref["servable"]["implementation"], "error": record.pop("error", ""),
                 "tokens": record.pop("tokens", None)}
        # afresh (mkdtemp) while no run is going: a link a run left under a fixed name would be followed
        backend_dir = Path(tempfile.mkdtemp(prefix="servable-backend-", dir=run_dir))
        second = _sandboxed("sandbox.serving.reference", port_python, {**ref_spec, "servable_dir": str(backend_dir.resolve()),
                                                              "export_only": True, "backend_only": True},
                            run_dir, list(dict.fromkeys([model_dir, ref_dir, bundle / "patched"])), 900)
        info = (second.get("servable") or {}) if second.get("ok") else {}
        if info.get("implementation") == "transformers-backend":
            record["first_attempt"] = first
            print(f"npuport: vLLM's {first['implementation']} class failed the model; trying vLLM's Transformers "
                  "backend over the patched code", file=sys.stderr, flush=True)
            client = serve_on(info, backend_dir, retry=True)
            if client is None and record.get("status") == "no vLLM path":
                # The backend refuses the class: vLLM's own class stays the path (on an NPU its kernels are
                # vllm-ascend's), failed here for the first reason; serve.sh is not stopped as if none existed.
                record.update(status="failed", implementation=first["implementation"], servable=ref["servable"],
                              backend_retry=record["error"], error=first["error"])
                record.pop("first_attempt")
                if first["tokens"]:
                    record["tokens"] = first["tokens"]
            elif client is None:  # both failed: the user reads both causes
                record["error"] = (f"vLLM's own class ({first['implementation']}): {first['error'][:2000]}\n"
                                   f"then vLLM's Transformers backend: {record.get('error', '')}")
        else:
            record.update(error=first["error"], **({"tokens": first["tokens"]} if first["tokens"] else {}))
            record["backend_retry"] = info.get("detail") or second.get("error") or "the backend export failed"
    if client is None:
        return record
    record["throughput"] = throughput_table(client.get("bench") or [], ref.get("transformers") or [],
                                            ref.get("transformers_batched") or [])
    record.update(transformers=ref.get("transformers") or [], transformers_batched=ref.get("transformers_batched") or [],
                  threads=THREADS)
    record["status"] = "served"  # serve_on returned a client only when the tokens passed
    if (req.tune if tune is None else tune) and not on_npu and (write_serve is not None or callable(tune)):
        from agents.deploy.engine_tune import engine_stage

        record["engine_tuning"] = engine_stage(
            run_dir, record, config, work, write_serve=write_serve, custom=tune if callable(tune) else None,
            run=_sandboxed, port=_free_port, python=str(vpython), ref_python=port_python, env=env, ro=readable,
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
    measured = {r["batch"]: (r.get("requests"), r.get("requests_planned")) for r in [*single, *batched]}
    return {"transformers_one_at_a_time_tok_s": one, "rows": rows,
            "transformers_requests": {str(b): {"measured": m, "planned": p} for b, (m, p) in measured.items()}}
