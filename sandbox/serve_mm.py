"""The image side of the deployment check's reference (runs inside the sandbox, beside sandbox/serve_ref.py):
for a model whose inputs the model's own preprocessing path built from a test image (sandbox/model_inputs.py),
the request the server gets is that image and that prompt text, through vLLM's chat API; the reference's
greedy tokens are the model's ``generate`` on the inputs its own code built.

What keeps the two sides on the same prompt: the image is the same file (sandbox/model_inputs.test_image,
deterministic from the config and the seed), the text is the one the preprocessing path was given (the
method's own placeholder, then the test prompt), the chat template only adds what the reference prompt
starts with (its BOS), and the server's tokenizer is the reference's (the folder's own, or npuport's
stand-in written as sandbox/serve_tokenizer.py does). The server returns the prompt ids it used, and
agents/deploy/serving.py compares them with the reference's before comparing tokens.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any


def image_request(model: Any, method_name: str, model_dir: Path, config: dict[str, Any], seed: int,
                  prompt_ids: list[int], out_dir: Path) -> dict[str, Any]:
    """What the client sends: the test image (a data URL), the prompt text, the chat template that renders
    it as the reference's prompt; and the tokenizer the reference used (for the servable folder)."""
    from sandbox.model_inputs import (
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

    from sandbox.inputs_base import cast_floats, model_float_dtype

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
