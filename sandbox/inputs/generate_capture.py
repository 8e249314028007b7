"""Stopping a model's own preprocessing path at its generate call: whatever the model's code hands to
``generate`` (or ``forward``) is the input, built by the model itself. Used by the infer-style path
(sandbox/inputs/model_inputs.py) and by a processor's batch through the model's own generate wrapper
(sandbox/inputs/processor_inputs.py). Self-contained; ships in the bundle beside run.py."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

if __package__:
    from .inputs_base import (
        DECODING_CONTROLS,
        PreprocessingFailed,
        cast_floats,
        has_tensor,
        model_float_dtype,
    )
else:  # beside a bundle's run.py
    from inputs_base import (  # type: ignore[no-redef]
        DECODING_CONTROLS,
        PreprocessingFailed,
        cast_floats,
        has_tensor,
        model_float_dtype,
    )


class _GenerateCalled(Exception):  # noqa: N818  (a signal, not an error)
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], owner: Any = None) -> None:
        super().__init__("generate called")
        self.call_args = args
        self.call_kwargs = kwargs
        self.owner = owner  # the module whose generate was called (the model, or a submodule: its language model)


@contextmanager
def intercepted(model: Any) -> Iterator[None]:
    """Within: ``self.generate(...)``, ``super().generate(...)`` and ``self(...)`` raise _GenerateCalled with
    their arguments (instance attributes shadow the class's methods; every class of the model's MRO that
    defines generate is patched for the duration, so a wrapper's ``super().generate`` is caught too)."""
    def intercept(*args: Any, **kwargs: Any) -> Any:
        raise _GenerateCalled(args, kwargs, model)

    def intercept_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise _GenerateCalled(args, kwargs, self)

    # the model's classes, and those of its submodules (a wrapper that generates through its language model)
    classes = dict.fromkeys(c for m in _modules(model) for c in type(m).__mro__ if "generate" in c.__dict__)
    patched = [(c, c.__dict__["generate"]) for c in classes]
    model.generate = intercept
    model.forward = intercept
    for c, _ in patched:
        setattr(c, "generate", intercept_method)  # noqa: B010  (a class attribute, for super().generate)
    try:
        yield
    finally:
        del model.generate
        del model.forward
        for c, original in patched:
            setattr(c, "generate", original)  # noqa: B010


def _modules(model: Any) -> list[Any]:
    named = getattr(model, "modules", None)
    return list(named()) if callable(named) else [model]


def owner_path(model: Any, owner: Any) -> str:
    """'' for the model itself, else the dotted name of the submodule whose generate was called."""
    if owner is None or owner is model:
        return ""
    named = getattr(model, "named_modules", None)
    for name, module in (named() if callable(named) else []):
        if module is owner:
            return name
    return ""


def call_until_generate(model: Any, call: Callable[[], Any], what: str) -> _GenerateCalled:
    """Run ``call`` (the model's own path) with generate intercepted; the intercepted call."""
    import torch

    try:
        with intercepted(model), torch.no_grad():
            call()
    except _GenerateCalled as got:
        return got
    except Exception as exc:
        raise PreprocessingFailed(f"{what} failed before calling generate: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    raise PreprocessingFailed(f"{what} returned without calling generate or forward")


def generate_arguments(model: Any, target: Any, captured: _GenerateCalled,
                       what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs: the tensor arguments generate got, by name, floats cast to the model's dtype; kwargs: the other
    arguments, decoding controls removed), bound to ``target``'s signature (the model's generate)."""
    import torch

    try:
        sig = inspect.signature(target)
        bound = sig.bind_partial(*captured.call_args, **captured.call_kwargs).arguments
    except TypeError as exc:
        raise PreprocessingFailed(f"{what} called generate with arguments it does not take: {exc}") from exc
    flat: dict[str, Any] = {}
    for name, value in bound.items():
        param = sig.parameters[name]
        if param.kind is param.VAR_KEYWORD:
            flat.update(value)
        elif param.kind is not param.VAR_POSITIONAL:
            flat[name] = value
    if "inputs" in flat and "input_ids" not in flat and isinstance(flat["inputs"], torch.Tensor) \
            and not flat["inputs"].is_floating_point():
        flat["input_ids"] = flat.pop("inputs")  # transformers' generate names its first argument `inputs`
    dtype = model_float_dtype(model)
    inputs = {k: cast_floats(v, dtype) for k, v in flat.items() if has_tensor(v)}
    kwargs = {k: v for k, v in flat.items() if not has_tensor(v) and k not in DECODING_CONTROLS and v is not None}
    if not inputs:
        raise PreprocessingFailed(f"{what} called generate without tensors")
    return inputs, kwargs
