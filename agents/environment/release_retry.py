"""When a run fails on a name transformers lacks, the next candidate release is tried.

The release was chosen from what the code reads (agents/environment/release_choice.py); a read the code
makes in a way no static reading sees (a name built at run time, an attribute of an object a call returned)
can still be missing. A failed run whose error names a transformers module or name (``No module named
'transformers.x'``, ``cannot import name 'X' from 'transformers.y'``, ``module 'transformers.y' has no
attribute 'X'``, ``'Model' object has no attribute 'm'`` of a model class derived from a transformers
class) rejects the release it ran on, the read joins the code's own, and the choice is made again among the
other releases: at most ``MAX_TRIES`` releases are rejected so. The environment is rebuilt for the new
release and the port runs again; the resolution lists every release tried and why each was rejected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.environment.api_needs import ROOT, Need
from agents.environment.release_choice import RunRejections, requirement_line
from agents.models import Diagnosis, StructuredException

MAX_TRIES = 3
RELEASE_FIX = "another-transformers-release"
_NO_MODULE = re.compile(r"No module named '(transformers(?:\.\w+)+)'")
_NO_NAME = re.compile(r"cannot import name '(\w+)' from '(transformers(?:\.\w+)*)'")
_MODULE_ATTR = re.compile(r"module '(transformers(?:\.\w+)*)' has no attribute '(\w+)'")
_OBJECT_ATTR = re.compile(r"(?:'(\w+)' object|type object '(\w+)') has no attribute '(\w+)'")


def _where(exc: StructuredException) -> str:
    frame = next((f for f in reversed(exc.frames) if f.in_model), None)
    return f"{frame.file}:{frame.line}" if frame else "the run"


def missing_read(exc: StructuredException, model_dir: Path) -> Need | None:
    """The transformers read a failed run's error names, or None when it names none."""
    where, msg = _where(exc), exc.message
    if exc.type in ("ModuleNotFoundError", "ImportError"):
        if m := _NO_NAME.search(msg):
            return Need((f"{m.group(2)}.{m.group(1)}",), where, "import")
        if m := _NO_MODULE.search(msg):
            return Need((m.group(1),), where, "import")
        return None
    if exc.type != "AttributeError":
        return None
    if m := _MODULE_ATTR.search(msg):
        return Need((f"{m.group(1)}.{m.group(2)}",), where, "attribute")
    if (m := _OBJECT_ATTR.search(msg)) is None:
        return None
    from agents.environment.api_needs import transformers_paths_of

    cls, attr = m.group(1) or m.group(2), m.group(3)
    paths = transformers_paths_of(model_dir, cls)
    return Need(tuple(f"{p}.{attr}" for p in paths), where, "attribute") if paths else None


@dataclass
class ReleaseRetry:
    """The diagnosis that routes the port to its next run, and the environment that run uses."""

    diagnosis: Diagnosis
    environment: dict[str, Any]


def _runs_so_far(resolution: dict[str, Any]) -> RunRejections:
    rejected = {}
    for line, why in (resolution.get("release_rejected") or {}).items():
        major, minor = line.split(".")
        rejected[(int(major), int(minor))] = why
    extra = tuple(Need(tuple(p), w, "run") for p, w in resolution.get("release_extra") or [])
    return RunRejections(rejected, extra)


def release_retry(state: dict[str, Any], run_id: str, exc: StructuredException,
                  history: list[Diagnosis]) -> ReleaseRetry | None:
    """The next candidate release for a run that failed on a name its release lacks, with its environment
    built; None when the error names no transformers read, the release was not chosen from the code's
    reads (the model pins transformers), ``MAX_TRIES`` releases were rejected already, or no other release
    provides every read."""
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve
    from agents.request import request_of
    from agents.state import environment_of, target_name_of
    from knowledge.errors import EnvBuildError, first_line

    environment = environment_of(state)
    resolution = environment.resolution or {}
    choice = resolution.get("release_choice") or {}
    req = request_of(state)
    model_dir = Path(req.model_path)
    need = missing_read(exc, model_dir) if choice.get("chosen") else None
    if need is None or not need.paths[0].startswith((f"{ROOT}.", "logging.")):
        return None
    runs = _runs_so_far(resolution)
    if len(runs.rejected) >= MAX_TRIES:
        return None
    ran = choice["chosen"]
    line = requirement_line(f"transformers~={'.'.join(ran.split('.')[:2])}.0")
    if line is None or line in runs.rejected:
        return None
    error = f"{exc.type}: {first_line(exc.message)[:160]}"
    runs = RunRejections({**runs.rejected, line: error}, (*runs.extra, need))
    target = target_name_of(state) or req.target
    try:
        again = resolve(model_dir, target, req.torch_npu, runs)
        after = (again.release_choice or {}).get("chosen")
        if not after or after == ran:
            return None
        python = ensure_env(again)
    except EnvBuildError:
        return None
    tried = "; ".join(f"{k[0]}.{k[1]}: {v}" for k, v in runs.rejected.items())
    summary = (f"the run on transformers {ran} failed on {need.paths[0]} ({error}), which the release lacks: "
               f"the next candidate, {after}, provides every read of the code and that one (releases rejected by "
               f"runs: {tried})")
    diagnosis = Diagnosis(id=f"diag-{len(history) + 1}", run_id=run_id, signature=f"missing-transformers-read:{ran}",
                          kind="missing-transformers-read", summary=summary, file=None, line=None, fix=RELEASE_FIX,
                          params={"release": after, "rejected": ran, "read": need.paths[0]})
    environment = environment.model_copy(update={"resolution": again.as_dict(),
                                                 "python": str(python) if python else None})
    return ReleaseRetry(diagnosis, environment.model_dump(mode="json"))
