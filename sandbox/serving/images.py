"""The image side of the deployment check's reference (runs inside the sandbox, beside sandbox/serving/reference.py):
for a model whose inputs the model's own preprocessing path built from a test image (sandbox/inputs/model_inputs.py),
the request the server gets is that image and that prompt text, through vLLM's chat API; the reference's
greedy tokens are the model's ``generate`` on the inputs its own code built.

What keeps the two sides on the same prompt: the image is the same file (sandbox/model_inputs.test_image,
deterministic from the config and the seed), the text is the one the preprocessing path was given (the
method's own placeholder, then the test prompt), the chat template only adds what the reference prompt
starts with (its BOS), and the server's tokenizer is the reference's (the folder's own, or npuport's
stand-in written as sandbox/serving/tokenizer.py does). The server returns the prompt ids it used, and
agents/deploy/serving.py compares them with the reference's before comparing tokens.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def image_request(model: Any, method_name: str, model_dir: Path, config: dict[str, Any], seed: int,
                  prompt_ids: list[int], out_dir: Path) -> dict[str, Any]:
    """What the client sends: the test image (a data URL), the prompt text, the chat template that renders
    it as the reference's prompt; and the tokenizer the reference used (for the servable folder)."""
    from sandbox.inputs.model_inputs import (
        TEST_PROMPT,
        _placeholder,
        load_tokenizer,
        preprocessing_method,
        test_image,
    )

    fn = preprocessing_method(model, method_name)
    mark = _placeholder(fn)
    image = test_image(config, seed, out_dir / f"npuport-test-image-{seed}.png")
    tok, how = load_tokenizer(model_dir, config)
    bos = getattr(tok, "bos_token_id", None)
    starts_with_bos = bos is not None and bool(prompt_ids) and prompt_ids[0] == bos
    template = ("{{ bos_token }}" if starts_with_bos else "") + "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return {"text": f"{mark}\n{TEST_PROMPT}" if mark else TEST_PROMPT, "placeholder": mark,
            "image_data_url": "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode(),
            "image_path": str(image), "chat_template": template, "prompt_ids": prompt_ids,
            "tokenizer": how, "stand_in": how.startswith("a stand-in")}


def generate_with(method: Any, inputs: dict[str, Any], max_new: int, kwargs: dict[str, Any]) -> Any:
    """The run method on the inputs the preprocessing path built (floating tensors cast to the model's
    dtype, as sandbox/model_inputs.capture_preprocessed_inputs does)."""
    import torch

    from sandbox.inputs.inputs_base import cast_floats, model_float_dtype

    model = getattr(method, "__self__", None)
    dtype = model_float_dtype(model) if model is not None else None
    with torch.no_grad():
        return method(**cast_floats(inputs, dtype), **{**kwargs, "max_new_tokens": max_new})


def throughput(method: Any, inputs: dict[str, Any], requests: list[dict[str, Any]], kwargs: dict[str, Any],
               deadline: float) -> dict[str, Any]:
    """Transformers one request at a time on the image request, each with a workload request's output
    length; past ``deadline`` no new request starts (at least one runs)."""
    start = time.perf_counter()
    tokens = done = 0
    for r in requests:
        if done and time.monotonic() > deadline:
            break
        generate_with(method, inputs, int(r["max_tokens"]), kwargs)
        tokens += int(r["max_tokens"])
        done += 1
    wall = time.perf_counter() - start
    return {"batch": 1, "requests": done, "requests_planned": len(requests), "output_tokens": tokens,
            "wall_s": round(wall, 3), "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None}


def replicate(inputs: dict[str, Any], batch: int) -> dict[str, Any]:
    """The image request ``batch`` times in one call: a tensor of batch 1 repeated along its first dimension,
    a one-item list (the model's per-image list) repeated; anything else as it is. Every copy is the same
    prompt, so no row is padded."""
    import torch

    out: dict[str, Any] = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == 1:
            out[k] = v.repeat(batch, *([1] * (v.dim() - 1)))
        elif isinstance(v, list) and len(v) == 1:
            out[k] = v * batch
        else:
            out[k] = v
    return out


def batched_throughput(method: Any, inputs: dict[str, Any], requests: list[dict[str, Any]], batch: int,
                       kwargs: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Transformers batched on the image request: batches of ``batch`` requests, each decoded to its longest
    output (what a caller of ``generate`` waits for), as the text side's batches are; past ``deadline`` no new
    batch starts (at least one runs). The model's own code decides whether its image inputs batch: when its
    generate fails on a batch, the row says so with its error instead of a rate."""
    start = time.perf_counter()
    tokens = done = computed = 0
    many = replicate(inputs, batch)
    for i in range(0, len(requests), batch):
        if done and time.monotonic() > deadline:
            break
        group = requests[i:i + batch]
        steps = max(int(r["max_tokens"]) for r in group)
        try:
            generate_with(method, many if len(group) == batch else replicate(inputs, len(group)), steps, kwargs)
        except Exception as exc:  # the model's generate takes one image request per call
            return {"batch": batch, "requests": 0, "requests_planned": len(requests), "output_tokens": 0,
                    "output_tokens_per_s": None,
                    "error": f"the model's generate does not batch its image inputs ({type(exc).__name__}: "
                             f"{str(exc)[:200]})"}
        tokens += sum(int(r["max_tokens"]) for r in group)
        done += len(group)
        computed += len(group) * steps
    wall = time.perf_counter() - start
    return {"batch": batch, "requests": done, "requests_planned": len(requests), "output_tokens": tokens,
            "wall_s": round(wall, 3), "output_tokens_per_s": round(tokens / wall, 2) if wall > 0 else None,
            "computed_tokens": computed}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@contextmanager
def peak_growth() -> Iterator[list[int]]:
    """The largest growth of this process's resident memory over the block (polled every 20 ms), in
    ``result[0]`` when the block ends."""
    result = [0]
    base, stop = _rss_bytes(), threading.Event()

    def poll() -> None:
        while not stop.wait(0.02):
            result[0] = max(result[0], _rss_bytes() - base)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield result
    finally:
        stop.set()
        t.join()
        result[0] = max(result[0], _rss_bytes() - base)


def batched_rows(method: Any, inputs: dict[str, Any], single: list[dict[str, Any]],
                 sizes: list[tuple[list[dict[str, Any]], int]], kwargs: dict[str, Any],
                 share_s: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One at a time, then each batch size in ascending order, each within ``share_s`` seconds. A batch whose
    memory, scaled from the largest batch measured so far (its growth per request), would not fit in what
    the host has available is not run: its row says so (a caller of ``generate`` would be killed there,
    and so would this whole measurement)."""
    with peak_growth() as grew:
        one = throughput(method, inputs, single, kwargs, time.monotonic() + share_s)
    per_request, rows = float(grew[0]), []
    for reqs, b in sorted(sizes, key=lambda s: s[1]):
        need, have = per_request * b, available_bytes()
        if have and need > 0.8 * have:
            rows.append({"batch": b, "requests": 0, "requests_planned": len(reqs), "output_tokens": 0,
                         "output_tokens_per_s": None,
                         "error": f"not run: a batch of {b} image requests would need ~{need / 2**30:.1f} GiB more "
                                  f"(scaled from the last batch measured), {have / 2**30:.1f} GiB is available"})
            continue
        with peak_growth() as grew:
            rows.append(batched_throughput(method, inputs, reqs, b, kwargs, time.monotonic() + share_s))
        per_request = max(per_request, grew[0] / b)
    return one, rows
