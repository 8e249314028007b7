"""The original's own failures: when the port fails and no class of the debugger fixes the failure (a class's fix
comes first: what the original also fails on here, the environment or made-up inputs, is fixed), the original
runs once on the CPU (the reference run: the original as written under the cuda -> cpu redirect,
agents/validation/compare.py). When it fails the same way (the same error type at the same line of the user's
file), the model fails by itself: the verdict says so at the user's file:line, and nothing npuport changed is
blamed or reverted. When it runs, the run is the reference the validator compares with later (it is not made
twice)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import sandbox
from agents.models import Numerics, RunRecord, StructuredException

# npuport's own run code (the harness, the input builders): an error raised there is never the model's, even
# when the original's run, built by the same code, raises it too
_OWN_RUN_CODE = Path(sandbox.__file__).resolve().parent

Site = Callable[[str | None], str | None]
"""Maps a file:line of the patched tree to the user's file (agents/sites.py port_site, bound to the port)."""


def _innermost(exc: StructuredException | None) -> str | None:
    frame = next((f for f in reversed(exc.frames) if f.in_model), None) if exc else None
    return f"{frame.file}:{frame.line}" if frame else None


def _raised_by_npuport(exc: StructuredException) -> bool:
    """Whether the innermost frame is npuport's own run code (say, inputs it synthesised from a config value)."""
    if not exc.frames or exc.frames[-1].in_model:
        return False
    return Path(exc.frames[-1].file).resolve().is_relative_to(_OWN_RUN_CODE)


def _message(exc: StructuredException) -> str:
    return (exc.message or "").strip().splitlines()[0][:200] if exc.message else ""


def same_failure(port: RunRecord, original: RunRecord, user_site: Site) -> str | None:
    """The user's file:line where both fail, when the original failed as the port did (same error type, and the
    same line of the user's file, or, without a model frame, the same message); else None."""
    a, b = port.exception, original.exception
    if original.ok or a is None or b is None or a.type != b.type or _raised_by_npuport(a):
        return None
    # the port's frames are lines of the patched tree, the original's lines of the user's own files
    port_where = user_site(_innermost(a))
    original_where = _innermost(b)
    if original_where and port_where == original_where:
        return original_where
    if not original_where and not _innermost(a) and _message(a) == _message(b):
        return "outside the model's files"
    return None


def model_fails_by_itself(state: dict[str, Any], port: RunRecord,
                          user_site: Site) -> tuple[list[dict[str, Any]], Numerics | None]:
    """(the reference run made, if one was: the state's new runs; the verdict when the original fails the same
    way as the port, else None). Once per port: a reference that ran already is used as it is."""
    from agents.state import runs_of
    from agents.validation.compare import reference_run

    made: list[dict[str, Any]] = []
    found = next((r for r in runs_of(state) if r.purpose == "reference"), None)
    if found is None:
        ref, _ = reference_run(state)
        made.append(ref.model_dump(mode="json"))
    else:
        ref = found
    where = same_failure(port, ref, user_site)
    if where is None:
        return made, None
    exc = ref.exception
    assert exc is not None
    detail = (f"the model fails by itself at {where}: {exc.type}: {_message(exc)} (the original, run as written on "
              "the CPU under the device redirect, fails there the same way as the port: nothing npuport changed is "
              "the cause, and nothing was reverted)")
    return made, Numerics(verdict="model-fails", detail=detail)
