"""The Transformers side of the deployment check (runs inside the sandbox, in the port's own environment):
the original model built exactly as the reference run built it (shrunk config, seeded weights), its greedy
tokens per prompt in float32 and in the serving dtype, its throughput run the way users of ``generate`` run
it (one request at a time, and batched with padding), and the servable folder vLLM loads
(sandbox/serving/export.py).

Run as ``python -I -m sandbox.serving.reference SPEC.json``; the result JSON goes to the result channel (the fd in
HARNESS_RESULT_FD, taken before any model code is imported, as sandbox/harness/worker.py does).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any

from sandbox.harness.feeding import model_inputs_for
from sandbox.harness.loading import import_with_stubs
from sandbox.harness.model_build import _load_attr, build_model, load_config
from sandbox.inputs.model_inputs import PROCESSOR_PATH, load_tokenizer, nested, seed_parameters
from sandbox.isolation.child_main import child_main
from sandbox.serving.client import load_at
from sandbox.serving.images import batched_rows as mm_rows
from sandbox.serving.images import generate_with, image_request
from sandbox.serving.tokenizer import write_stand_in


def _new_tokens(output: Any, prompt: list[int]) -> list[int]:
    import torch

    if isinstance(output, dict):
        output = output.get("tokens", output.get("sequences"))
    row = output[0].tolist() if isinstance(output, torch.Tensor) else list(output[0])
    return row[len(prompt):] if row[:len(prompt)] == prompt else row


def _prompts(inputs: dict[str, Any]) -> list[list[int]]:
    """The unpadded prompt rows of the reference's inputs (the mask marks the padding)."""
    ids = inputs["input_ids"]
    mask = inputs.get("attention_mask")
    rows = []
    for i in range(ids.shape[0]):
        row = ids[i].tolist()
        rows.append([t for t, m in zip(row, mask[i].tolist(), strict=True) if m] if mask is not None else row)
    return rows


def _generate(method: Any, prompts: list[list[int]], max_new: int, pad: int, kwargs: dict[str, Any]) -> Any:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    extra = {"attention_mask": mask} if _accepts(method, "attention_mask") else {}  # a model's own generate may not
    with torch.no_grad():
        return method(input_ids=ids, **extra, **{**kwargs, "max_new_tokens": max_new})


def _required_beyond_text(method: Any) -> list[str]:
    """Parameters the run method requires that a text prompt does not give (an image, say)."""
    import inspect

    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in ("input_ids", "self")
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


def _accepts(method: Any, name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


TOP_K = 5


def _logits_of(model: Any, ids: list[int]) -> Any:
    """The model's next-token logits at every position of ``ids`` (one forward pass), or None when its
    forward does not return them."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long))
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        logits = out[0]
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[1] != len(ids):
        return None
    return logits[0].float()


def teacher_forced_logprobs(model: Any, prompt: list[int], tokens: list[int], k: int = TOP_K) -> list[dict[str, Any]] | None:
    """Per generated position of ``tokens`` (decoded after ``prompt``): the top-k log-probabilities
    ({token id: logprob}) and the logprob of the token itself, from one forward pass over prompt +
    tokens (teacher forcing: every position sees the reference's own context)."""
    import torch

    if not tokens:
        return []
    logits = _logits_of(model, prompt + tokens[:-1])
    if logits is None:
        return None
    lp = torch.log_softmax(logits[len(prompt) - 1:], dim=-1)
    top = torch.topk(lp, k, dim=-1)
    return [{"top": {int(i): round(float(v), 5) for i, v in zip(top.indices[n].tolist(), top.values[n].tolist(),
                                                               strict=True)},
             "token": int(tokens[n]), "token_logprob": round(float(lp[n, tokens[n]]), 5)}
            for n in range(len(tokens))]


def _throughput(method: Any, requests: list[dict[str, Any]], batch: int, pad: int,
                kwargs: dict[str, Any], deadline: float | None = None) -> dict[str, Any]:
    """Requested output tokens per second: batches of ``batch`` requests, each batch padded to its longest
    prompt and decoded to its longest output (what a caller of ``generate`` waits for). Past ``deadline``
    (time.monotonic) no new batch starts: the rate is over the requests measured (at least one batch).
    Latency, per batch as a server running ``generate`` would give it (a request waits for its batch): TTFT is a
    call generating one token on the first batch, TPOT the rest of that batch's time per decoded step.
    ``computed_tokens`` counts the rows x steps decoded (padding included) against the tokens asked for."""
    start = time.perf_counter()
    tokens = done = computed = 0
    first_s = 0.0
    for i in range(0, len(requests), batch):
        if done and deadline is not None and time.monotonic() > deadline:
            break
        group = requests[i:i + batch]
        t = time.perf_counter()
        steps = max(r["max_tokens"] for r in group)
        _generate(method, [r["prompt"] for r in group], steps, pad, kwargs)
        first_s = first_s or time.perf_counter() - t
        tokens += sum(r["max_tokens"] for r in group)
        done += len(group)
        computed += len(group) * steps
    wall = time.perf_counter() - start
    group = requests[:batch]
    t = time.perf_counter()
    _generate(method, [r["prompt"] for r in group], 1, pad, kwargs)
    ttft = time.perf_counter() - t
    steps = max(r["max_tokens"] for r in group)
    return {"batch": batch, "requests": done, "requests_planned": len(requests), "output_tokens": tokens,
            "wall_s": round(wall, 3), "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
            "computed_tokens": computed, "median_ttft_ms": round(ttft * 1000, 1),
            "median_tpot_ms": round(max(first_s - ttft, 0.0) / max(steps - 1, 1) * 1000, 2)}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from sandbox.cuda_redirect import redirect
    from sandbox.serving.export import export

    began = time.monotonic()
    model_dir = Path(spec["model_dir"]).resolve()
    manifest = spec["manifest"]
    seed = int(spec.get("seed", 0))
    out: dict[str, Any] = {"ok": False}
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))  # the same CPU threads as the server's engine
    redirect.install("cpu")  # the original's cuda calls run on the CPU, as in the reference run
    sys.path.insert(0, str(model_dir))
    # CUDA-only modules the original imports (flash_attn, ...) are stubbed as in the reference run
    stubbed: list[str] = []
    config, _ = load_config(model_dir, manifest, shrink=bool(spec.get("shrink")),
                            overrides=spec.get("config_overrides"))
    cls = import_with_stubs(lambda: _load_attr(manifest["entry"]["class"], model_dir), True, stubbed)

    def fresh(dtype: str) -> Any:
        """The model as the reference built it (same seeded weights), in ``dtype`` before its first call: a
        model converted after running keeps caches of the old dtype (rotary tables kept as attributes)."""
        torch.manual_seed(seed)
        built = import_with_stubs(lambda: build_model(cls, config, model_dir), True, stubbed)
        seed_parameters(built, seed)
        return built.eval().to(getattr(torch, dtype))

    model = fresh("float32")
    run_cfg = manifest.get("run") or {}
    kwargs = dict(run_cfg.get("kwargs") or {})
    max_new = int(spec.get("max_new_tokens") or kwargs.get("max_new_tokens") or 8)
    kwargs.pop("max_new_tokens", None)
    inputs, _, _ = model_inputs_for(model, manifest, model_dir, config, seed, dict(kwargs))
    if "input_ids" not in inputs:
        raise ValueError(f"the model's inputs have no input_ids ({', '.join(inputs)}): the text check needs a prompt")
    prompts = _prompts(inputs)
    method = getattr(model, run_cfg.get("method", "generate"))
    beyond_text = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    image = None
    if beyond_text and run_cfg.get("preprocess") and run_cfg["preprocess"] != PROCESSOR_PATH:
        # Built by the model's own preprocessing path from a test image: the server gets that image.
        image = image_request(model, run_cfg["preprocess"], model_dir, config, seed, prompts[0],
                              Path(spec["servable_dir"]).parent)
        out["image_request"] = image
    elif needed := _required_beyond_text(method):
        # still exported below: the record then says whether vLLM has a path for the model at all
        out["not_driven"] = (f"the model's {run_cfg.get('method', 'generate')} requires {', '.join(needed)}, which "
                             "npuport's served check cannot supply: only text prompts and images built by the "
                             "model's own preprocessing method are driven through the server")
    pad = int(config.get("pad_token_id") or 0)
    out["prompts"] = prompts
    out["max_new_tokens"] = max_new
    phases: dict[str, float] = {"build_s": round(time.monotonic() - began, 1)}
    out["phases"] = phases
    mark = time.monotonic()
    low = spec.get("dtype") or "bfloat16"
    name = run_cfg.get("method", "generate")
    refs: dict[str, list[list[int]]] = {}
    out["reference_tokens"] = refs  # filled below (none when only the throughput is asked for)
    if spec.get("throughput_only"):  # Transformers' throughput alone (at other threads): no export, no references
        models = {low: fresh(low)}
        del model
    else:
        # Saved before any dtype cast: the served weights are the reference's float32 weights.
        out["servable"] = export(model, config, model_dir, Path(spec["code_dir"]), Path(spec["servable_dir"]),
                                 set(spec.get("vllm_archs") or []), set(spec.get("vllm_model_types") or []),
                                 backend_only=bool(spec.get("backend_only")))
        if out.get("not_driven"):
            out["ok"] = True
            return out
        if image is not None and image["stand_in"] and out["servable"]["implementation"] != "none":
            # vLLM's image processor needs a tokenizer: the reference's stand-in, as a tokenizer.json
            tok, _ = load_tokenizer(model_dir, config)
            write_stand_in(tok, int(nested(config, "vocab_size") or 0), model_dir, Path(spec["servable_dir"]), image["text"])
            out["servable"]["tokenizer"] = True
            out["servable"]["tokenizer_note"] = ("npuport's stand-in tokenizer (the folder has none that loads), written "
                                                 "as tokenizer.json: the reference's ids per character")
        if spec.get("export_only"):  # a second servable folder; the references came from the first run
            out["ok"] = True
            return out
        models = {"float32": model, low: fresh(low)}
        for dtype, m in models.items():
            call = getattr(m, name)
            refs[dtype] = ([_new_tokens(generate_with(call, inputs, max_new, kwargs), prompts[0])] if image is not None
                           else [_new_tokens(_generate(call, [p], max_new, pad, kwargs), p) for p in prompts])
        # Top-k logprobs along the float32 tokens, in float32 and in the serving dtype (the reference's own drift),
        # for the served check's near-ties (agents/deploy/token_gate.py).
        try:
            if image is not None:
                raise ValueError("teacher forcing along an image prompt is not driven (the model's forward takes the "
                                 "image inputs its own generate prepares)")
            lps = {dtype: [teacher_forced_logprobs(m, p, t) for p, t in zip(prompts, refs["float32"], strict=True)]
                   for dtype, m in models.items()}
            out["reference_logprobs"] = lps if all(v is not None for rows in lps.values() for v in rows) else None
            if out["reference_logprobs"] is None:
                out["logprobs_note"] = "the model's forward returns no per-position logits: no logprobs compared"
        except Exception as exc:  # a forward the text path cannot drive (extra required inputs, ...)
            out["reference_logprobs"] = None
            out["logprobs_note"] = f"the reference logprobs could not be computed ({type(exc).__name__}: {str(exc)[:200]})"
        if low != "float32":
            del models["float32"]
        del model
    method = getattr(models[low], name)  # Transformers' throughput in the serving dtype
    phases["reference_s"] = round(time.monotonic() - mark, 1)
    # Each throughput measurement gets an equal share of the budget (a loaded host must not time the run out).
    sizes = [(spec["requests"], b, "transformers") for b in spec.get("batches") or []] + \
        [(load_at(spec["batch_requests"], b), b, "transformers_batched") for b in spec.get("batch_sizes") or []]
    share = float(spec.get("throughput_budget_s") or 600) / max(len(sizes), 1)
    out["transformers"], out["transformers_batched"] = [], []
    if image is not None:  # the image request, one at a time and batched (copies of it, as the model's code takes them)
        cap = spec.get("image_requests")  # the port's check caps the image load; the bench serves the whole workload
        image_sizes = [(spec["batch_requests"][:cap] if cap else load_at(spec["batch_requests"], b), b)
                       for b in spec.get("batch_sizes") or [] if not cap or b <= cap]
        share = float(spec.get("throughput_budget_s") or 600) / (1 + len(image_sizes))
        one, out["transformers_batched"] = mm_rows(method, inputs, spec["requests"], image_sizes, kwargs, share)
        out["transformers"].append(one)
        sizes = []
    for reqs, b, key in sizes:
        out[key].append(_throughput(method, reqs, b, pad, kwargs, time.monotonic() + share))
    phases["throughput_s"] = round(time.monotonic() - mark - phases["reference_s"], 1)
    out["transformers_dtype"] = low
    out["ok"] = True
    return out


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "exception": {"type": type(exc).__name__, "message": str(exc)[:2000],
                                       "traceback": traceback.format_exc()[-4000:]}}


def main(argv: list[str] | None = None) -> int:
    return child_main(run, _error, argv)


if __name__ == "__main__":
    sys.exit(main())
