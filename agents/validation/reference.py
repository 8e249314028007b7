"""The reference: the original as its authors ran it, as closely as a CUDA-less host allows.

The reference run is the ORIGINAL tree under the cuda -> cpu redirect (agents/validation.py). Some originals
cannot even be built without a CUDA kernel: a constructor asserts that FlashAttention imported although only
the forward path a flag selects would call it, or a kernel-path flag is hard-wired to True. Such an original,
run as written, fails on any host without CUDA, so nothing could be validated against it. The reference then
gets the same switch-only fix the port gets (hazard H13's codemods: a constructor's kernel assert deferred to
where the kernel is called, a hard-wired kernel flag set False, so the model's own torch path runs; H4's
FlashAttention selection, in the code or in config.json, set to "eager", which transformers builds without
flash_attn; no computation of the model is changed), applied to the reference copy only, never to the user's folder, and
only after the original as written failed. Every edit is listed in the report ("reference adjusted: ...")
with the failure that called for it; a silent one would be no reference at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.models import Diagnosis, Patch
from agents.workspace import Workspace

# Codemods that only switch a CUDA-only kernel path off (they never change what the model computes on the
# path that runs): the hazard rules' own fixes, applied to the reference copy, with their parameters.
# FlashAttention becomes "eager": the plain attention every implementation table has.
SWITCH_ONLY_FIXES: dict[str, dict[str, Any]] = {"defer-kernel-assert": {}, "kernel-path-off": {},
                                                "attn-impl-sdpa": {"impl": "eager"}}
CONFIG_SWITCH_FIXES: dict[str, dict[str, Any]] = {"config-attn-impl": {"impl": "eager"}}  # on config.json
NOTES_FILE = "reference-adjusted.json"  # in the workdir, beside original/: the adjustments made, once
# The debugger's fixes of failures the environment causes, not the target (a name an older release's star import
# provided, a spelling or keyword of another release: hazards H24, H25). The original fails the same way in the
# same environment, so the reference copy gets the same fix, with the same parameters; they change no computation.
ENVIRONMENT_FIXES = frozenset({"import-missing-name", "rename-changed-api", "accept-new-keyword"})
REPLAY_FILE = "reference-replay.json"  # in the workdir: the environment fixes the reference copy replays


def environment_replay(patches: list[Patch], diagnoses: list[Diagnosis]) -> list[dict[str, Any]]:
    """The port's environment fixes as [{"codemod", "file", "params"}], in patch order (the static plan's have no
    parameters; a diagnosis's carry its own)."""
    params_of = {d.id: d.params for d in diagnoses}
    return [{"codemod": p.codemod, "file": f, "params": dict(params_of.get(p.diagnosis_id or "", {}))}
            for p in patches if p.codemod in ENVIRONMENT_FIXES for f in p.files]


def reference_dir(ws: Workspace) -> Path:
    """The original as committed, extracted once (the reference runs from it)."""
    original = ws.root / "original"
    ws.original_tree(original)
    return original


def adjustments(ws: Workspace) -> list[str]:
    """The adjustments already made to this workspace's reference copy (empty: it runs as written)."""
    path = ws.root / NOTES_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        return []
    return [str(n) for n in data] if isinstance(data, list) else []


def adjust_tree(root: Path, replay: list[dict[str, Any]] | None = None) -> list[str]:
    """Apply the switch-only fixes to every Python file under ``root`` (in place), then the port's environment
    fixes (``replay``); "file line N: what" per edit. Applying them twice changes nothing the second time."""
    from agents.fixing.codemods import CODEMODS

    notes = _switch_fixes(root, CODEMODS)
    for fix in replay or []:
        path = root / str(fix.get("file") or "")
        name = str(fix.get("codemod") or "")
        if name not in ENVIRONMENT_FIXES or not path.is_file() or not path.resolve().is_relative_to(root.resolve()):
            continue
        try:
            result = CODEMODS[name][0](path.read_text(encoding="utf-8"), file=fix["file"], **(fix.get("params") or {}))
        except Exception:  # noqa: BLE001 - a file libcst cannot parse: left as written
            continue
        if result.changed:
            path.write_text(result.source, encoding="utf-8")
            notes += [f"{fix['file']} {e}" for e in result.edits]
    return notes


def _switch_fixes(root: Path, codemods: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    files = [(p, SWITCH_ONLY_FIXES) for p in sorted(root.rglob("*.py"))]
    files += [(p, CONFIG_SWITCH_FIXES) for p in sorted(root.rglob("config.json"))]
    for path, fixes in files:
        rel = path.relative_to(root).as_posix()
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for name, params in fixes.items():
            fn = codemods[name][0]
            try:
                result = fn(source, file=rel, **params)
            except Exception:  # a file libcst cannot parse: left as written
                break
            if result.changed:
                source = result.source
                notes += [f"{rel} {e}" for e in result.edits]
        if source != path.read_text(encoding="utf-8"):
            path.write_text(source, encoding="utf-8")
    return notes


def reference_copy(ws: Workspace, adjusted: bool) -> Path:
    """The workspace's reference copy of the original, with the switch-only fixes applied when validation
    needed them (``adjusted``: a reference run of the port says ``reference_adjusted``; idempotent: a copy
    extracted afresh gets them)."""
    original = reference_dir(ws)
    if adjusted:
        adjust_tree(original, _replay(ws))
    return original


def _replay(ws: Workspace) -> list[dict[str, Any]]:
    path = ws.root / REPLAY_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def adjust_reference(ws: Workspace, failure: str, replay: list[dict[str, Any]] | None = None) -> list[str]:
    """After the original as written failed (``failure``: what it raised, where): apply the switch-only
    fixes, and the port's environment fixes (``replay``), to the reference copy; the notes for the report
    (empty when no such fix applies)."""
    switch = adjust_tree(reference_dir(ws))
    env = adjust_tree(reference_dir(ws), replay) if replay else []
    if not switch and not env:
        return []
    notes = [f"reference adjusted: {e} (the original as written cannot be built on a host without CUDA: {failure}; "
             "the same switch-only fix the port gets, applied to the reference copy only)" for e in switch]
    notes += [f"reference adjusted: {e} (the original as written fails in this environment: {failure}; the same "
              "environment fix the port gets, applied to the reference copy only)" for e in env]
    (ws.root / REPLAY_FILE).write_text(json.dumps(replay or [], indent=1))
    (ws.root / NOTES_FILE).write_text(json.dumps(notes, indent=1))
    return notes


def failure_text(exc: Any) -> str:
    """'AssertionError: ... at modeling_x.py:171' from a RunRecord's structured exception."""
    if exc is None:
        return "it failed"
    where = next((f"{f.file}:{f.line}" for f in reversed(exc.frames) if f.in_model), "")
    first = (exc.message or "").strip().splitlines()[0][:160] if exc.message else ""
    return f"{exc.type}: {first}" + (f" at {where}" if where else "")
