"""Fit the shrunk config to the model's constructor: build the model on the meta device (no memory, no
weights) with each of sandbox/shrink.py's candidates, most reduced first, and keep the first the
constructor accepts. A constructor's invariants are code (``num_heads = embed_dim // 128``, a width that
must divide by 64, a ratio of two sizes); when the derived sizes break one, the level whose sizes broke
it keeps its widths and heads, and the shrink notes say which error made it back off, at which line.

Used by the harness inside the sandbox: imports nothing of agents/graph.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.shrink import estimate_params, shrink_candidates

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


def _constructs(build: Callable[[dict[str, Any]], Any], config: dict[str, Any]) -> BaseException | None:
    """None when the model builds with ``config``: on the meta device, or, where the constructor needs real
    values (``.item()``, numpy of a tensor), on the CPU (the config is small)."""
    import torch

    try:
        with torch.device("meta"):
            build(config)
        return None
    except Exception as exc:  # the constructor's own error is the answer
        if "meta" not in str(exc).lower() or estimate_params(config) > CPU_TRIAL_MAX_PARAMS:
            return exc
    try:
        build(config)
        return None
    except Exception as exc:
        return exc


def fit_to_constructor(build: Callable[[dict[str, Any]], Any], config: dict[str, Any],
                       overrides: dict[str, Any] | None, model_dir: Path,
                       extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(small config, changes): the most reduced of shrink_candidates(config) that the constructor
    accepts, ``extra`` (the run's config overrides) applied to each. When none builds, the derived
    config, so the run reports the constructor's error as it is."""
    candidates = shrink_candidates(config, overrides, model_dir)
    first = _constructs(build, {**candidates[0][1], **(extra or {})})
    if first is None:
        return {**candidates[0][1], **(extra or {})}, candidates[0][2]
    why = _why(first, model_dir)
    if len(candidates) > 1:
        # The least reduced first: when it fails the same way, the error is not about the shrunk sizes.
        last = _constructs(build, {**candidates[-1][1], **(extra or {})})
        if last is None or _why(last, model_dir) != why:
            for kept, small, changes in candidates[1:]:
                trial = {**small, **(extra or {})}
                if (last is None and small is candidates[-1][1]) or _constructs(build, trial) is None:
                    levels = ", ".join(sorted(k.rstrip(".") or "(top level)" for k in kept))
                    return trial, [*changes, f"backed off to keep {levels} as written: the constructor refused the "
                                             f"smaller sizes ({why})"]
    return {**candidates[0][1], **(extra or {})}, [
        *candidates[0][2], f"the constructor fails whatever the shrunk sizes ({why}): not a size the shrink chose"]
