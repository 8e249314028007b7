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
from sandbox.inputs.model_inputs import PROCESSOR_PATH, load_tokenizer, nested_int, seed_parameters
from sandbox.isolation.child_main import child_main
from sandbox.serving.client import load_at, progress
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


def teacher_forced_logprobs(model: Any, prompt: list[int], tokens: list[int],
                            k: int = TOP_K) -> list[dict[str, Any]] | None:
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


class _Side:
    """The Transformers side as it goes: the spec, the model as the reference built it, its inputs and prompts."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.model_dir = Path(spec["model_dir"]).resolve()
        self.manifest = spec["manifest"]
        self.seed = int(spec.get("seed", 0))
        # CUDA-only modules the original imports (flash_attn, ...), stubbed as in the reference run
        self.stubbed: list[str] = []
        # the config the port ran with (the deployment passes it: never a small config derived again)
        self.config, _ = load_config(self.model_dir, self.manifest, shrink=bool(spec.get("shrink")),
                                     overrides=spec.get("config_overrides"), run_config=spec.get("run_config"))
        self.cls = import_with_stubs(lambda: _load_attr(self.manifest["entry"]["class"], self.model_dir), True,
                                      self.stubbed)
        run_cfg = self.manifest.get("run") or {}
        self.preprocess = run_cfg.get("preprocess")
        self.name = run_cfg.get("method", "generate")
        self.kwargs = dict(run_cfg.get("kwargs") or {})
        self.max_new = int(spec.get("max_new_tokens") or self.kwargs.get("max_new_tokens") or 8)
        self.kwargs.pop("max_new_tokens", None)
        self.pad = int(self.config.get("pad_token_id") or 0)
        self.low = spec.get("dtype") or "bfloat16"

    def fresh(self, dtype: str) -> Any:
        """The model as the reference built it (same seeded weights), in ``dtype`` before its first call: a
        model converted after running keeps caches of the old dtype (rotary tables kept as attributes)."""
        import torch

        torch.manual_seed(self.seed)
        built = import_with_stubs(lambda: build_model(self.cls, self.config, self.model_dir), True, self.stubbed)
        seed_parameters(built, self.seed)
        return built.eval().to(getattr(torch, dtype))


def _inputs(side: _Side, model: Any, out: dict[str, Any]) -> tuple[dict[str, Any], list[list[int]], Any]:
    """The reference's inputs and prompt rows, and the image request when the model's own preprocessing built them."""
    inputs, _, _ = model_inputs_for(model, side.manifest, side.model_dir, side.config, side.seed, dict(side.kwargs))
    if "input_ids" not in inputs:
        raise ValueError(f"the model's inputs have no input_ids ({', '.join(inputs)}): the text check needs a prompt")
    prompts = _prompts(inputs)
    beyond_text = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    image = None
    if beyond_text and side.preprocess and side.preprocess != PROCESSOR_PATH:
        # Built by the model's own preprocessing path from a test image: the server gets that image.
        image = image_request(model, side.preprocess, side.model_dir, side.config, side.seed, prompts[0],
                              Path(side.spec["servable_dir"]).parent)
        out["image_request"] = image
    elif needed := _required_beyond_text(getattr(model, side.name)):
        # still exported below: the record then says whether vLLM has a path for the model at all
        out["not_driven"] = (f"the model's {side.name} requires {', '.join(needed)}, which npuport's served check "
                             "cannot supply: only text prompts and images built by the model's own preprocessing "
                             "method are driven through the server")
    return inputs, prompts, image


def _export(side: _Side, model: Any, image: dict[str, Any] | None, out: dict[str, Any]) -> None:
    """The servable folder (saved before any dtype cast: the served weights are the reference's float32 weights)."""
    from sandbox.serving.export import export

    spec = side.spec
    out["servable"] = export(model, side.config, side.model_dir, Path(spec["code_dir"]), Path(spec["servable_dir"]),
                             set(spec.get("vllm_archs") or []), set(spec.get("vllm_model_types") or []),
                             backend_only=bool(spec.get("backend_only")))
    if image is not None and image["stand_in"] and out["servable"]["implementation"] != "none" \
            and not out.get("not_driven"):
        # vLLM's image processor needs a tokenizer: the reference's stand-in, as a tokenizer.json
        tok, _ = load_tokenizer(side.model_dir, side.config)
        write_stand_in(tok, (nested_int(side.config, "vocab_size") or 0), side.model_dir, Path(spec["servable_dir"]),
                       image["text"])
        out["servable"]["tokenizer"] = True
        out["servable"]["tokenizer_note"] = ("npuport's stand-in tokenizer (the folder has none that loads), written "
                                             "as tokenizer.json: the reference's ids per character")


def _references(side: _Side, models: dict[str, Any], inputs: dict[str, Any], prompts: list[list[int]],
                image: dict[str, Any] | None, out: dict[str, Any]) -> None:
    """Greedy tokens per prompt in each dtype, and the top-k logprobs along the float32 tokens in each (the
    reference's own drift) for the served check's near-ties (agents/deploy/token_gate.py)."""
    refs: dict[str, list[list[int]]] = out["reference_tokens"]
    for dtype, m in models.items():
        call = getattr(m, side.name)
        refs[dtype] = ([_new_tokens(generate_with(call, inputs, side.max_new, side.kwargs), prompts[0])]
                       if image is not None
                       else [_new_tokens(_generate(call, [p], side.max_new, side.pad, side.kwargs), p)
                             for p in prompts])
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


def _transformers_throughput(side: _Side, method: Any, inputs: dict[str, Any], image: dict[str, Any] | None,
                             out: dict[str, Any]) -> None:
    """Transformers' throughput in the serving dtype: one request at a time, and batched at each batch size; each
    measurement gets an equal share of the budget (a loaded host must not time the run out)."""
    spec = side.spec
    sizes = [(spec["requests"], b, "transformers") for b in spec.get("batches") or []] + \
        [(load_at(spec["batch_requests"], b), b, "transformers_batched") for b in spec.get("batch_sizes") or []]
    share = float(spec.get("throughput_budget_s") or 600) / max(len(sizes), 1)
    out["transformers"], out["transformers_batched"] = [], []
    if image is not None:  # the image request, one at a time and batched (copies of it, as the model's code takes them)
        cap = spec.get("image_requests")  # the port's check caps the image load; the bench serves the whole workload
        image_sizes = [(spec["batch_requests"][:cap] if cap else load_at(spec["batch_requests"], b), b)
                       for b in spec.get("batch_sizes") or [] if not cap or b <= cap]
        share = float(spec.get("throughput_budget_s") or 600) / (1 + len(image_sizes))
        one, out["transformers_batched"] = mm_rows(method, inputs, spec["requests"], image_sizes, side.kwargs, share)
        out["transformers"].append(one)
        sizes = []
    for reqs, b, key in sizes:
        out[key].append(_throughput(method, reqs, b, side.pad, side.kwargs, time.monotonic() + share))


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from sandbox.cuda_redirect import redirect

    began = time.monotonic()
    out: dict[str, Any] = {"ok": False, "reference_tokens": {}}  # no references when only the throughput is asked for
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))  # the same CPU threads as the server's engine
    redirect.install("cpu")  # the original's cuda calls run on the CPU, as in the reference run
    progress(spec, "deployment: building the original as the reference did (Transformers, float32)")
    side = _Side(spec)
    sys.path.insert(0, str(side.model_dir))
    model = side.fresh("float32")
    inputs, prompts, image = _inputs(side, model, out)
    out["prompts"], out["max_new_tokens"] = prompts, side.max_new
    phases: dict[str, float] = {"build_s": round(time.monotonic() - began, 1)}
    out["phases"] = phases
    mark = time.monotonic()
    if spec.get("throughput_only"):  # Transformers' throughput alone (at other threads): no export, no references
        models = {side.low: side.fresh(side.low)}
        del model
    else:
        progress(spec, "deployment: writing the servable folder")
        _export(side, model, image, out)
        if out.get("not_driven") or spec.get("export_only"):  # export_only: the references came from the first run
            out["ok"] = True
            return out
        progress(spec, f"deployment: Transformers' reference tokens (float32 and {side.low})")
        models = {"float32": model, side.low: side.fresh(side.low)}
        _references(side, models, inputs, prompts, image, out)
        if side.low != "float32":
            del models["float32"]
        del model
    phases["reference_s"] = round(time.monotonic() - mark, 1)
    progress(spec, "deployment: Transformers' throughput (one request at a time"
             + (", batched)" if spec.get("batch_sizes") else ")"))
    _transformers_throughput(side, getattr(models[side.low], side.name), inputs, image, out)
    phases["throughput_s"] = round(time.monotonic() - mark - phases["reference_s"], 1)
    out["transformers_dtype"] = side.low
    out["ok"] = True
    return out


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "exception": {"type": type(exc).__name__, "message": str(exc)[:2000],
                                       "traceback": traceback.format_exc()[-4000:]}}


def main(argv: list[str] | None = None) -> int:
    return child_main(run, _error, argv)


if __name__ == "__main__":
    sys.exit(main())
