"""The Transformers side of the deployment check (runs inside the sandbox, in the port's own environment):
the original model built exactly as the reference run built it (shrunk config, seeded weights), its greedy
tokens per prompt in float32 and in the serving dtype, its throughput run the way users of ``generate`` run
it (one request at a time, and batched with padding), and the servable folder vLLM loads
(sandbox/serve_export.py).

Run as ``python -I -m sandbox.serve_ref SPEC.json``; the result JSON goes to the result channel (the fd in
HARNESS_RESULT_FD, taken before any model code is imported, as sandbox/harness.py does).
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path
from typing import Any

from sandbox.child_main import child_main
from sandbox.harness import _import_with_stubs, _load_attr, build_model, load_config, model_inputs_for
from sandbox.model_inputs import seed_parameters


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


def _throughput(method: Any, requests: list[dict[str, Any]], batch: int, pad: int,
                kwargs: dict[str, Any]) -> dict[str, Any]:
    """Requested output tokens per second: batches of ``batch`` requests, each batch padded to its longest
    prompt and decoded to its longest output (what a caller of ``generate`` waits for). Latency, per batch as
    a server running ``generate`` would give it (a request waits for its batch): TTFT is a call generating one
    token on the first batch, TPOT the rest of that batch's time per decoded step. ``computed_tokens`` counts
    the rows x steps decoded (padding included) against the tokens asked for."""
    start = time.perf_counter()
    tokens = computed = 0
    first_s = 0.0
    for i in range(0, len(requests), batch):
        group = requests[i:i + batch]
        t = time.perf_counter()
        steps = max(r["max_tokens"] for r in group)
        _generate(method, [r["prompt"] for r in group], steps, pad, kwargs)
        first_s = first_s or time.perf_counter() - t
        tokens += sum(r["max_tokens"] for r in group)
        computed += len(group) * steps
    wall = time.perf_counter() - start
    group = requests[:batch]
    t = time.perf_counter()
    _generate(method, [r["prompt"] for r in group], 1, pad, kwargs)
    ttft = time.perf_counter() - t
    steps = max(r["max_tokens"] for r in group)
    return {"batch": batch, "requests": len(requests), "output_tokens": tokens, "wall_s": round(wall, 3),
            "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None, "computed_tokens": computed,
            "median_ttft_ms": round(ttft * 1000, 1),
            "median_tpot_ms": round(max(first_s - ttft, 0.0) / max(steps - 1, 1) * 1000, 2)}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from sandbox import redirect
    from sandbox.serve_export import export

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
    config, _ = load_config(model_dir, manifest, {"shrink": spec.get("shrink"),
                                                  "config_overrides": spec.get("config_overrides")})
    cls = _import_with_stubs(lambda: _load_attr(manifest["entry"]["class"], model_dir), True, stubbed)
    torch.manual_seed(seed)
    model = _import_with_stubs(lambda: build_model(cls, config, model_dir), True, stubbed)
    seed_parameters(model, seed)
    model.eval()
    run_cfg = manifest.get("run") or {}
    kwargs = dict(run_cfg.get("kwargs") or {})
    max_new = int(spec.get("max_new_tokens") or kwargs.get("max_new_tokens") or 8)
    kwargs.pop("max_new_tokens", None)
    inputs, _, _ = model_inputs_for(model, manifest, model_dir, config, seed, dict(kwargs))
    if "input_ids" not in inputs:
        raise ValueError(f"the model's inputs have no input_ids ({', '.join(inputs)}): the text check needs a prompt")
    prompts = _prompts(inputs)
    method = getattr(model, run_cfg.get("method", "generate"))
    if needed := _required_beyond_text(method):
        raise ValueError(f"the model's {run_cfg.get('method', 'generate')} requires {', '.join(needed)}: the served "
                         "check drives text prompts only (image inputs through vLLM's multimodal API are not "
                         "exercised on this host yet)")
    pad = int(config.get("pad_token_id") or 0)
    out["prompts"] = prompts
    out["max_new_tokens"] = max_new
    refs: dict[str, list[list[int]]] = {}
    if spec.get("throughput_only"):  # Transformers' throughput alone (at other threads): no export, no references
        model.to(getattr(torch, spec.get("dtype") or "bfloat16"))
    else:
        # Saved before any dtype cast: the served weights are the reference's float32 weights.
        out["servable"] = export(model, config, model_dir, Path(spec["code_dir"]), Path(spec["servable_dir"]),
                                 set(spec.get("vllm_archs") or []))
        for dtype in ("float32", spec.get("dtype") or "bfloat16"):
            model.to(getattr(torch, dtype))
            refs[dtype] = [_new_tokens(_generate(method, [p], max_new, pad, kwargs), p) for p in prompts]
    out["reference_tokens"] = refs
    out["transformers"] = [_throughput(method, spec["requests"], b, pad, kwargs) for b in spec.get("batches") or []]
    out["transformers_batched"] = [_throughput(method, spec["batch_requests"], b, pad, kwargs)
                                   for b in spec.get("batch_sizes") or []]
    out["transformers_dtype"] = spec.get("dtype") or "bfloat16"
    out["ok"] = True
    return out


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "exception": {"type": type(exc).__name__, "message": str(exc)[:2000],
                                       "traceback": traceback.format_exc()[-4000:]}}


def main(argv: list[str] | None = None) -> int:
    return child_main(run, _error, argv)


if __name__ == "__main__":
    sys.exit(main())
