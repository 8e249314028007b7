"""Inputs rebuilt with the model's own input-building code, after a run on made-up inputs failed on the
generate path for want of something that code builds (the debugger's ``rebuild-inputs``, hazard H26): an
argument ``prepare_inputs_for_generation`` requires (``token_type_ids``), or a token the model looks for in
the prompt (its image-start id).

The model's own input builder is a method of the release's classes (or a function of its modules) whose
returned dict holds ``input_ids`` and every needed name, read from its source, never from its name
(``build_conversation_input_ids(tokenizer, query=..., images=[...])`` returns input_ids, token_type_ids,
attention_mask, images). It is called with the folder's tokenizer (else the stand-in), a test prompt and,
when it takes images, a test image; one example becomes a batch of one. Without such a builder, the folder's
processor, when its batch holds what is needed. Nothing is made up: when neither provides it, this fails and
the harness says so. Self-contained; ships in the bundle beside run.py."""

from __future__ import annotations

import ast
import inspect
import re
import tempfile
import textwrap
from pathlib import Path
from typing import Any

if __package__:
    from .inputs_base import (
        TEST_PROMPT,
        PreprocessingFailed,
        cast_floats,
        model_float_dtype,
        shape_text,
        test_image,
    )
    from .processor_inputs import processor_inputs
    from .stand_in_tokenizer import load_tokenizer
else:  # beside a bundle's run.py
    from inputs_base import (  # type: ignore[no-redef]
        TEST_PROMPT,
        PreprocessingFailed,
        cast_floats,
        model_float_dtype,
        shape_text,
        test_image,
    )
    from processor_inputs import processor_inputs  # type: ignore[no-redef]
    from stand_in_tokenizer import load_tokenizer  # type: ignore[no-redef]

_IMAGE_PARAM = re.compile(r"^(image|img|picture|photo|pixel_value)s?$", re.IGNORECASE)
_PROMPT_PARAM = re.compile(r"^(prompt|query|question|text|instruction|message)s?$", re.IGNORECASE)
_HISTORY_PARAM = re.compile(r"^(history|histories|messages|conversation)$", re.IGNORECASE)
_NOT_BUILDERS = frozenset({"forward", "generate", "__init__", "__call__", "prepare_inputs_for_generation", "chat",
                           "stream_chat", "_init_weights", "post_init"})


def _library(module: str) -> bool:
    return module.split(".")[0] in ("transformers", "torch", "builtins")


def returned_keys(fn: Any) -> set[str]:
    """The string keys of the dicts a function builds (dict literals, ``dict(k=...)``), read from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return set()
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            keys |= {k.arg for k in node.keywords if k.arg}
    return keys


def input_builders(model: Any, needs: list[str]) -> list[tuple[str, Any]]:
    """(name, bound method) of the model's own methods whose returned dict holds input_ids and ``needs``."""
    wanted = {"input_ids", *needs}
    out: list[tuple[str, Any]] = []
    for cls in type(model).__mro__:
        if _library(cls.__module__):
            continue
        for name, fn in cls.__dict__.items():
            if name in _NOT_BUILDERS or not inspect.isfunction(fn) or name in {n for n, _ in out}:
                continue
            if wanted <= returned_keys(fn):
                out.append((name, getattr(model, name)))
    return out


def builder_arguments(fn: Any, tokenizer: Any, config: dict[str, Any], seed: int, tmp: Path) -> dict[str, Any]:
    """The tokenizer, a test prompt, a test image (a PIL image, in a list where the name is plural), an empty
    history; defaults elsewhere. A required parameter of another kind: the builder cannot be driven."""
    args: dict[str, Any] = {}
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name == "tokenizer":
            args[name] = tokenizer
        elif _PROMPT_PARAM.match(name):
            args[name] = TEST_PROMPT
        elif _IMAGE_PARAM.match(name):
            from PIL import Image

            image = Image.open(test_image(config, seed, tmp / f"npuport-test-image-{seed}.png")).convert("RGB")
            args[name] = [image] if name.endswith("s") else image
        elif _HISTORY_PARAM.match(name):
            args[name] = []
        elif p.default is p.empty:
            raise PreprocessingFailed(f"{fn.__name__} needs {name!r}, which npuport cannot supply")
    return args


def batch_of_one(out: dict[str, Any]) -> dict[str, Any]:
    """One example (input_ids of one dimension) as a batch of one: its 1-D tensors gain a batch axis, its lists
    (images) are wrapped in a list."""
    import torch

    ids = out.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        return out
    return {k: v.unsqueeze(0) if isinstance(v, torch.Tensor) and v.dim() == 1 else [v] if isinstance(v, list) else v
            for k, v in out.items()}


def _holds(inputs: dict[str, Any], needs: list[str], token: int | None) -> bool:
    import torch

    ids = inputs.get("input_ids")
    has_token = token is None or (isinstance(ids, torch.Tensor) and bool((ids == token).any()))
    return all(n in inputs for n in needs) and has_token


def own_built_inputs(model: Any, model_dir: Path, config: dict[str, Any], seed: int, needs: list[str],
                     token: int | None = None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(inputs, generate kwargs, notes) from the model's own input builder, else its folder's processor; raises
    PreprocessingFailed when neither gives ``needs`` (and ``token`` in the ids)."""
    import torch

    tried: list[str] = []
    tokenizer, how = load_tokenizer(model_dir, config)
    for name, fn in input_builders(model, needs):
        try:
            with tempfile.TemporaryDirectory(prefix="npuport-inputs-") as tmp:
                built = fn(**builder_arguments(fn, tokenizer, config, seed, Path(tmp)))
        except Exception as exc:  # noqa: BLE001 - the next builder, or the processor
            tried.append(f"{type(model).__name__}.{name}(): {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if not isinstance(built, dict):
            tried.append(f"{type(model).__name__}.{name}() returned a {type(built).__name__}, not a dict")
            continue
        inputs = batch_of_one({k: v for k, v in built.items() if isinstance(v, torch.Tensor | list)})
        if not _holds(inputs, needs, token):
            tried.append(f"{type(model).__name__}.{name}() gave {', '.join(sorted(inputs))}")
            continue
        dtype = model_float_dtype(model)
        inputs = {k: cast_floats(v, dtype) for k, v in inputs.items()}
        image = " and image" if any(_IMAGE_PARAM.match(p) for p in inspect.signature(fn).parameters) else ""
        return inputs, {}, [f"inputs rebuilt by the model's own {type(model).__name__}.{name}() with {how} and a test "
                            f"prompt{image}: "
                            + ", ".join(f"{k} {shape_text(v)}" for k, v in inputs.items())]
    try:
        inputs, kwargs, notes = processor_inputs(model, model_dir, config, seed)
    except PreprocessingFailed as exc:
        tried.append(str(exc)[:160])
    else:
        if _holds(inputs, needs, token):
            return inputs, kwargs, [f"inputs rebuilt by the folder's own processor: {notes[0]}", *notes[1:]]
        tried.append(f"the folder's processor gave {', '.join(sorted(inputs))}")
    want = ", ".join(needs) + (f"{', ' if needs else ''}token {token} in the prompt" if token is not None else "")
    raise PreprocessingFailed(f"no input-building code of the model gives {want or 'its inputs'}"
                              + (f" (tried: {'; '.join(tried)})" if tried else " (it has no builder or processor)"))
