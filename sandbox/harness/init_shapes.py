"""Parameters that the model's own weight init gives another shape than its constructor did.

transformers runs a model's ``_init_weights`` only for the weights a checkpoint lacks; a random-weight build
(``--shrink``, the reference) runs it for every module. Some releases' init reshapes a parameter it never
meets when loading real weights (RWKV-6 assigns ``time_decay.data = decay_speed.reshape(num_heads,
head_size)`` to a parameter built as ``(1, 1, attention_hidden_size)``), and the forward then fails at full
size as well as shrunk. A checkpoint keeps the constructor's shape, so the harness restores it: the init's
values, in the constructor's layout (same number of elements), and says so with the shrink notes.

Used by the harness inside the sandbox: imports nothing of agents/graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def _without_init_weights(cls: type) -> Iterator[None]:
    """The model classes' own ``_init_weights`` (each class of the MRO that defines one) as no-ops."""
    saved = {c: c.__dict__["_init_weights"] for c in cls.__mro__ if "_init_weights" in c.__dict__}
    try:
        for c in saved:
            c._init_weights = lambda self, module: None  # type: ignore[attr-defined]
        yield
    finally:
        for c, fn in saved.items():
            c._init_weights = fn  # type: ignore[attr-defined]


def constructor_shapes(cls: type, build: Callable[[], Any]) -> dict[str, tuple[int, ...]]:
    """{parameter name: shape} as the constructor makes them: the model built on the meta device (no memory)
    with its weight init switched off; {} when that build fails (nothing to compare)."""
    import torch

    try:
        with torch.device("meta"), _without_init_weights(cls):
            model = build()
    except Exception:
        return {}
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def restore_constructor_shapes(model: Any, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Give each parameter the init reshaped its constructor's shape back (same elements); the notes."""
    import math

    import torch

    notes: list[str] = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            want = shapes.get(name)
            if want is None or tuple(p.shape) == want or p.numel() != math.prod(want):
                continue
            notes.append(f"{name}: the model's weight init gave it shape {tuple(p.shape)}, its constructor "
                         f"{want} (a checkpoint keeps that one; the init runs only for weights a checkpoint "
                         "lacks): restored, same values")
            p.data = p.data.reshape(want)
    return notes
