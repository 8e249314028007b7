"""What a run's method returned, as the harness records it: greedy token ids (a generate call), or, for a
model run through forward (an encoder: no LM head, no generate), its named floating outputs
(``last_hidden_state``, ``pooler_output``, ``logits``, an embedding tensor...), saved for the validator to
compare with the original's within a stated tolerance (agents/validation.py).

Runs inside the sandbox harness; imports nothing of npuport beyond torch."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

MAX_OUTPUT_TENSORS = 16
MAX_OUTPUT_BYTES = 256 * 1024 * 1024  # float32 bytes of every saved output together


def token_ids(output: Any) -> list[list[int]] | None:
    """Greedy ids: an integer tensor (batch x length), a dict holding one as ``tokens``/``sequences``
    (generate's dict output), or a list of id rows; None for anything else (a forward's outputs)."""
    import torch

    if isinstance(output, Mapping):
        inner = output.get("tokens", output.get("sequences"))
        return token_ids(inner) if inner is not None else None
    if isinstance(output, torch.Tensor):
        if output.is_floating_point() or output.is_complex() or output.dtype == torch.bool:
            return None
        rows = output.detach().to("cpu")
        return rows.reshape(1, -1).tolist() if rows.dim() <= 1 else rows.reshape(-1, rows.shape[-1]).tolist()
    if isinstance(output, list) and output and all(isinstance(r, list) and all(isinstance(i, int) for i in r)
                                                   for r in output):
        return output
    return None


def named_outputs(output: Any) -> dict[str, Any]:
    """The floating tensors a forward returned, by name: a ModelOutput's / dict's fields, a tuple's items
    (``output[i]``), or the tensor itself (``output``). Nested containers (hidden-state tuples, KV caches)
    are left out; at most MAX_OUTPUT_TENSORS, in order."""
    import torch

    if isinstance(output, torch.Tensor):
        items: list[tuple[str, Any]] = [("output", output)]
    elif isinstance(output, Mapping):
        items = [(str(k), v) for k, v in output.items()]
    elif isinstance(output, list | tuple):
        items = [(f"output[{i}]", v) for i, v in enumerate(output)]
    else:
        items = []
    out: dict[str, Any] = {}
    for name, value in items:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            out[name] = value
        if len(out) >= MAX_OUTPUT_TENSORS:
            break
    return out


def kept_for_comparison(tensors: dict[str, Any]) -> dict[str, Any]:
    """The outputs on the host in float32 (a bounded total), for the validator."""
    import torch

    kept: dict[str, Any] = {}
    total = 0
    for name, t in tensors.items():
        size = t.numel() * 4
        if total + size > MAX_OUTPUT_BYTES:
            continue
        total += size
        kept[name] = t.detach().to("cpu", torch.float32).contiguous()
    return kept


def describe(tensors: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """name -> {shape, dtype} for the result (and the report)."""
    return {n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for n, t in tensors.items()}


def digest(tensors: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name, t in tensors.items():
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]
