"""Fit the shrunk config to the model's constructor and forward: build the model on the meta device (no
memory, no weights) with each of sandbox/harness/shrink.py's candidates, most reduced first, run one forward of a
short prompt on it (meta tensors: shapes only, no arithmetic), and keep the first candidate both accept.
A constructor's invariants are code (``num_heads = embed_dim // 128``, a width that must divide by 64, a
ratio of two sizes), and so are a forward's (a reshape to a head count another key decides, a residual of
two widths); when the derived sizes break one, the level whose sizes broke it keeps its widths and heads,
and the shrink notes say which error made it back off, at which line. A forward that meta tensors cannot
run (a data-dependent branch, ``.item()``) says nothing either way.

Used by the harness inside the sandbox: imports nothing of agents/graph.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.harness.shrink import (
    _EXPERT_KEYS,
    _FFN_KEYS,
    _HEAD_KEYS,
    _HIDDEN_KEYS,
    _KV_KEYS,
    _LAYER_KEYS,
    estimate_params,
    shrink_candidates,
)

CPU_TRIAL_MAX_PARAMS = 250_000_000  # a trial build on the CPU (where meta cannot build) stays under ~1 GiB


def _where(exc: BaseException, model_dir: Path) -> str:
    """The innermost frame in the model's code: "file.py:LINE"."""
    root = str(model_dir.resolve())
    inside = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(root)]
    if not inside:
        return "outside the model's code"
    f = inside[-1]
    return f"{Path(f.filename).resolve().relative_to(root).as_posix()}:{f.lineno}"


def _why(exc: BaseException, model_dir: Path) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''} at {_where(exc, model_dir)}"


PROMPT_LEN = 4
FORWARD = "a forward of a short prompt (meta tensors)"
# What a forward on meta tensors cannot do: read a value (``.item()``, a data-dependent branch or shape),
# copy out, or reach an op without a meta kernel. Such an error says nothing about the sizes.
_META_LIMIT = ("meta", "data-dependent", "item()", "cannot be called on", "Cannot copy out", "not implemented for")


def _meta_limited(exc: BaseException) -> bool:
    return isinstance(exc, NotImplementedError) or any(m in str(exc) for m in _META_LIMIT)


def _forward_on_meta(model: Any, config: dict[str, Any]) -> BaseException | None:
    """The model's forward on a short meta prompt (token ids, batch 1): its error when the sizes break an
    invariant the forward holds; None when it runs, when it takes no token ids, or when meta tensors cannot
    run it (a data-dependent op)."""
    import inspect

    import torch

    forward = getattr(model, "forward", None)
    if not callable(forward):
        return None
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    if "input_ids" not in params:
        return None
    kwargs: dict[str, Any] = {"input_ids": torch.zeros((1, PROMPT_LEN), dtype=torch.long, device="meta")}
    if "decoder_input_ids" in params:  # an encoder-decoder: its decoder reads the same short prompt
        kwargs["decoder_input_ids"] = kwargs["input_ids"]
    if "use_cache" in params:
        kwargs["use_cache"] = False
    try:
        with torch.no_grad():
            forward(**kwargs)
        return None
    except Exception as exc:
        return None if _meta_limited(exc) else exc


def _constructs(build: Callable[[dict[str, Any]], Any], config: dict[str, Any]) -> tuple[str, BaseException] | None:
    """None when the model builds with ``config`` and a forward of a short prompt holds: on the meta device,
    or, where the constructor needs real values (``.item()``, numpy of a tensor), built on the CPU (the
    config is small; the forward is then not tried). Else (what refused it, the model's error)."""
    import torch

    try:
        with torch.device("meta"):
            model = build(config)
    except Exception as exc:  # the constructor's own error is the answer
        if "meta" not in str(exc).lower() or estimate_params(config) > CPU_TRIAL_MAX_PARAMS:
            return "the constructor", exc
    else:
        refused = _forward_on_meta(model, config)
        return None if refused is None else (FORWARD, refused)
    try:
        build(config)
        return None
    except Exception as exc:
        return "the constructor", exc


def fit_to_constructor(build: Callable[[dict[str, Any]], Any], config: dict[str, Any],
                       overrides: dict[str, Any] | None, model_dir: Path,
                       extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(small config, changes): the most reduced of shrink_candidates(config) that the constructor and a
    forward of a short prompt accept, ``extra`` (the run's config overrides) applied to each. When none
    does, the derived config, so the run reports the model's error as it is."""
    candidates = shrink_candidates(config, overrides, model_dir)
    first = _constructs(build, {**candidates[0][1], **(extra or {})})
    if first is None:
        return {**candidates[0][1], **(extra or {})}, candidates[0][2]
    stage, why = first[0], _why(first[1], model_dir)
    if len(candidates) > 1:
        # The least reduced first: when it fails the same way, the error is not about the shrunk sizes.
        last = _constructs(build, {**candidates[-1][1], **(extra or {})})
        if last is not None and stage == FORWARD and last[0] == FORWARD and _why(last[1], model_dir) == why:
            # the forward fails with every size (arguments a bare prompt lacks, the model's own bug): it says
            # nothing about the sizes, and the constructor accepted the derived ones
            return {**candidates[0][1], **(extra or {})}, candidates[0][2]
        if last is None or _why(last[1], model_dir) != why:
            for kept, small, changes in candidates[1:]:
                trial = {**small, **(extra or {})}
                if (last is None and small is candidates[-1][1]) or _constructs(build, trial) is None:
                    levels = ", ".join(sorted(k.rstrip(".") or "(top level)" for k in kept))
                    return trial, [*changes, f"backed off to keep {levels} as written: {stage} refused the "
                                             f"smaller sizes ({why})"]
    return {**candidates[0][1], **(extra or {})}, [
        *candidates[0][2], f"{stage} fails whatever the shrunk sizes ({why}): not a size the shrink chose"]


_SIZE_KEYS = (_LAYER_KEYS, _HIDDEN_KEYS, _HEAD_KEYS, _KV_KEYS, _FFN_KEYS, _EXPERT_KEYS)


def sized_by_class_defaults(config: dict[str, Any], configure: Callable[[dict[str, Any]], Any] | None
                            ) -> tuple[dict[str, Any], list[str]]:
    """config.json with the sizes its config class fills in by default at a nested level that does not write its
    layer count, and a note per level.
    transformers writes a nested sub-config as its difference from that class's defaults, so a release may give
    its language model only a model type (``text_config: {"model_type": "phi3"}``): the model is built at the
    class's default sizes (32 layers of 3072), which the shrink reduces only when it sees them. The top level
    is written whole and is left as it is."""
    try:
        built = configure(config) if configure is not None else None
        effective = built.to_dict() if built is not None else None
    except Exception:  # noqa: BLE001  (the build reports the config class's own error)
        effective = None
    if not isinstance(effective, dict):
        return config, []
    notes: list[str] = []
    out = dict(config)
    for key, value in config.items():
        if isinstance(value, dict) and isinstance(effective.get(key), dict):
            out[key] = _filled(value, effective[key], f"{key}.", notes)
    return out, notes


def _filled(level: dict[str, Any], effective: dict[str, Any], prefix: str, notes: list[str]) -> dict[str, Any]:
    out = {key: _filled(v, effective[key], f"{prefix}{key}.", notes)
           if isinstance(v, dict) and isinstance(effective.get(key), dict) else v for key, v in level.items()}
    added = {k: v for k, v in effective.items() if k not in level and isinstance(v, int) and not isinstance(v, bool)
             and v > 0 and any(r.match(k) for r in _SIZE_KEYS)}
    # only a level whose layer count was dropped as a default: a module config with no layers of its own (a
    # pooling head's widths) is left as written
    if added and any(_LAYER_KEYS.match(k) for k in added):
        out.update(added)
        notes.append(f"{prefix.rstrip('.')}: {', '.join(f'{k} {v}' for k, v in added.items())} from its config "
                     "class's defaults (config.json does not write them), so the shrink reduces them too")
    return out
