"""What every inputs module shares (sandbox/inputs/model_inputs.py, stand_in_tokenizer.py, processor_inputs.py):
the test prompt and image, the file names that say a folder ships a tokenizer or a processor, the error a
preprocessing path raises, and tensor helpers. Self-contained (torch, numpy, Pillow): it ships in the bundle
beside run.py with the other inputs modules."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SYNTH_TOKENS = 8  # prompt length of synthesised inputs
TEST_PROMPT = "Read the text in the image."
TEST_IMAGE_MAX_SIDE = 448  # small, so tiling code stays in its single-view branch on a 2-core box
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
PROCESSOR_PATH = "AutoProcessor"  # run.preprocess value: the folder's processor, not a method of the model
# generate() arguments that steer decoding rather than describe the input: npuport's run kwargs decide
# these (greedy, N new tokens), and a streamer would print every token.
DECODING_CONTROLS = frozenset({"streamer", "max_new_tokens", "max_length", "min_new_tokens", "min_length",
                               "do_sample", "temperature", "top_p", "top_k", "num_beams", "generation_config",
                               "logits_processor", "stopping_criteria", "synced_gpus", "assistant_model"})

try:  # inside npuport, one of its errors; beside a bundle's run.py (no npuport there), a plain one
    from knowledge.errors import NpuportError as _ErrorBase
except ImportError:  # pragma: no cover - exercised by the bundle's run.py
    # its own class: `class X(Exception, RuntimeError)` has no consistent MRO and would fail at import
    class _ErrorBase(Exception):  # type: ignore[no-redef]
        pass


class PreprocessingFailed(_ErrorBase, RuntimeError):
    """The preprocessing path could not be driven; the message says why (the harness falls back)."""


def nested(config: dict[str, Any], key: str) -> Any:
    """config[key], else the first value under that key in a nested sub-config."""
    if config.get(key) is not None:
        return config[key]
    for v in config.values():
        if isinstance(v, dict):
            found = nested(v, key)
            if found is not None:
                return found
    return None


def present_run_method(model: Any, manifest: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The manifest, with ``generate`` run as ``forward`` when the built model has no generate (a PreTrainedModel
    that never mixed GenerationMixin in: transformers 4.50 took generate off PreTrainedModel, so a class loaded as
    a causal LM generates only in the releases before), and the note saying so; else the manifest as it is."""
    run_cfg = manifest.get("run") or {}
    # a preprocessing path may generate through a submodule (its language model's generate): left to it
    if run_cfg.get("method", "generate") != "generate" or callable(getattr(model, "generate", None)) \
            or run_cfg.get("preprocess") or not callable(getattr(model, "forward", None)):
        return manifest, None
    note = (f"{type(model).__name__} has no generate in this transformers release (the class does not derive from "
            "GenerationMixin; PreTrainedModel stopped providing generate in 4.50): it runs forward, and its named "
            "outputs are compared")
    return {**manifest, "run": {**run_cfg, "method": "forward"}}, note


def with_folder_token_ids(model: Any, model_dir: Path) -> Any:
    """The model with the special token ids of the folder's generation_config.json in its generation config, as
    from_pretrained loads them (an encoder-decoder's ``decoder_start_token_id`` often lives only there:
    generate refuses to start without it). Only token ids: the decoding itself stays the run's greedy one."""
    path = model_dir / "generation_config.json"
    target = getattr(model, "generation_config", None)
    if target is None or not path.is_file():
        return model
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return model
    for key, value in (saved.items() if isinstance(saved, dict) else ()):
        if key.endswith(("_token_id", "_token_ids")) and (_token_id(value) or (
                isinstance(value, list) and value and all(_token_id(v) for v in value))):
            setattr(target, key, value)
    return model


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_LENGTH_PARAM = re.compile(r"^(max|min)_(generation_|gen_|new_|output_)?(length|len|tokens)$")


def length_arguments(method: Any, inputs: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for a custom generate that takes its own required length parameters (``generate(input_ids, ...,
    min_generation_length, max_generation_length)``): the maximum gets the run's ``max_new_tokens`` (which the
    method then no longer receives: it passes its own on), the minimum 0; anything else as it was."""
    import inspect

    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return kwargs
    wanted = [n for n, p in params.items() if _LENGTH_PARAM.match(n) and p.default is p.empty
              and n not in inputs and n not in kwargs]
    if not wanted:
        return kwargs
    out = dict(kwargs)
    longest = int(out.pop("max_new_tokens", None) or SYNTH_TOKENS)
    for name in wanted:
        out[name] = longest if name.startswith("max") else 0
    return out


def nested_int(config: dict[str, Any], key: str) -> int | None:
    """The first usable size under ``key`` (this level, then the sub-configs): a positive int, a numeric string
    ("32000") or the first of a list of them (``image_size: [384, 384]``); a value that is none of those (a config
    that writes ``"vocab_size": "None"``) is skipped, never passed to int()."""
    value = config.get(key)
    if isinstance(value, list | tuple) and value:
        value = value[0]
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return next((found for v in config.values() if isinstance(v, dict)
                 for found in [nested_int(v, key)] if found is not None), None)


def test_image(config: dict[str, Any], seed: int, path: Path) -> Path:
    """A deterministic noise RGB image (PNG), square, at most TEST_IMAGE_MAX_SIDE pixels a side."""
    import numpy as np
    from PIL import Image

    side = min(nested_int(config, "image_size") or 64, TEST_IMAGE_MAX_SIDE)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), "RGB").save(path)
    return path


def model_float_dtype(model: Any) -> Any:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def cast_floats(value: Any, dtype: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if dtype is not None and value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


def has_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_tensor(v) for v in value)
    return False


def shape_text(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shape_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        inner = ", ".join(shape_text(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return type(value).__name__


def with_embedding_rows(model: Any, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``vocab_size`` raised to the rows the model's input embedding really has, when it has
    more: an embedding that appends rows of its own for added tokens (Molmo's image tokens sit past
    config.json's vocab_size, in a second table beside the first) takes those ids, so a stand-in tokenizer
    keeps them. The rows are the first dimension of the embedding module's own 2-D tables, summed."""
    rows = embedding_rows(model)
    vocab = nested_int(config, "vocab_size")
    if rows and (vocab is None or rows > vocab):  # also a config whose vocab_size is no number
        return {**config, "vocab_size": rows}
    return config


def embedding_rows(model: Any) -> int:
    """The rows of the model's input embedding (its own 2-D tables, summed), 0 when it has none to read."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except Exception:  # noqa: BLE001  (a model whose getter is not wired: the config's size stands)
        embedding = None
    params = getattr(embedding, "parameters", None)
    if not callable(params):
        return 0
    return sum(int(p.shape[0]) for p in params(recurse=False) if getattr(p, "dim", lambda: 0)() == 2)
