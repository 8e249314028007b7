"""Failure signatures: a failed run's structured exception -> a stable signature, and the fix and
citation that the hazard rule explaining it names. The rules' own error patterns are tried first (among them
the classes of plain Python failures: a name missing at run time, H24; an attribute or keyword that changed
between releases, H25; an input the generate path needs, H26), then the generic kinds (missing module,
timeout, out of memory, crash, shape mismatch, any exception). A failure no class fits says which class it
came closest to and why that one does not fit."""

from __future__ import annotations

import re
from typing import Any

from agents.models import Citation, Frame, StructuredException
from agents.rules.base import Registry, Signature
from agents.rules.registry import active

_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def innermost_model_frame(exc: StructuredException) -> Frame | None:
    for f in reversed(exc.frames):
        if f.in_model:
            return f
    return None


def classify(exc: StructuredException, registry: Registry | None = None) -> Signature:
    """Map an exception to a stable failure signature."""
    frame = innermost_model_frame(exc)
    where = f"{frame.file}:{frame.line}" if frame else "outside the model"
    for _rule, pattern in (registry or active()).patterns():
        sig = pattern.match(exc, frame, where)
        if sig is not None:
            return sig
    msg = exc.message
    if exc.type in ("ModuleNotFoundError", "ImportError") and (mm := _MISSING_MODULE.search(msg)):
        root = mm.group(1).split(".")[0]
        why = (f"{mm.group(1)} belongs to another transformers release than this environment's: the environment's "
               "choice of release, not a patch" if root == "transformers" else
               f"the environment has no package providing {mm.group(1)} (the model's requirements or imports did not "
               "name one the index has)")
        return Signature("missing-module", f"missing-module:{root}@{where}",
                         f"the model imports {mm.group(1)}, which is not installed here ", frame, {"no_fix": why})
    if exc.type == "Timeout":
        return Signature("timeout", "timeout", exc.message, frame)
    if exc.type in ("OutOfMemoryError",) or "out of memory" in msg.lower():
        return Signature("oom", f"oom@{where}", f"out of memory at {where}", frame)
    if exc.type == "ProcessDied":
        return Signature("crash", "crash", exc.message, frame)
    if exc.type in ("RuntimeError", "ValueError") and re.search(r"size|shape|dimension", msg):
        return Signature("shape-mismatch", f"shape-mismatch@{where}", f"a shape mismatch at {where}: {msg[:160]}",
                         frame)
    closest, why = closest_class(exc, frame)
    return Signature("exception", f"exception:{exc.type}@{where}", f"{exc.type} at {where}: {msg[:200]}", frame,
                     {"closest": closest, "why_not": why})


def closest_class(exc: StructuredException, frame: Frame | None) -> tuple[str, str]:
    """(the class a failure no class fits came closest to, why that class does not fit it)."""
    generate = any(f.func in ("generate", "_sample", "prepare_inputs_for_generation") or "generation/utils.py" in f.file
                   for f in exc.frames)
    if generate:
        return "generate-inputs", (f"it is raised on the generate path, but a {exc.type}, not a missing input, a "
                                   "token absent from the prompt or the model's input check")
    if exc.type in ("KeyError", "IndexError", "LookupError"):
        return "changed-api", (f"a {exc.type} is a lookup the running release may answer differently, but it names "
                               "no attribute or keyword to respell")
    if exc.type in ("RuntimeError", "ValueError") and re.search(r"dtype|DT_\w+|Half|BFloat16|Double", exc.message):
        return "npu-dtype", "it mentions a dtype but no NPU kernel's dtype check"
    if frame is None:
        return "changed-api", f"a {exc.type} raised outside the model's files, with no name, attribute or keyword in it"
    return "changed-api", (f"a {exc.type} in the model's code ({frame.file}:{frame.line}), not a missing name, "
                           "attribute or keyword")


def explain(sig: Signature, registry: Registry | None = None) -> tuple[str | None, dict[str, Any], list[Citation]]:
    """(fix, params, citations) that the rule explaining ``sig`` names; (None, {}, []) when none does. The fix is
    a codemod, or an action that is not one (``sig.details["action"]``: the run's inputs rebuilt). Among the
    patterns of the signature's kind, the one whose codemod the signature asks for (``details["fix"]``)."""
    pairs = [(r, p) for r, p in (registry or active()).patterns() if p.kind == sig.kind]
    if not pairs:
        return None, {}, []
    want = sig.details.get("fix")
    rule, p = next(((r, p) for r, p in pairs if want and p.fix == want), pairs[0])
    citations = [Citation(source=rule.topic, title=p.title)]
    action = sig.details.get("action")
    if isinstance(action, str):
        return action, dict(sig.details.get("params") or {}), citations
    if (p.needs_frame and sig.frame is None) or (p.fix_if is not None and not p.fix_if(sig)):
        return None, {}, citations if sig.details.get("no_fix") else []
    params = p.params(sig) if p.params is not None and p.fix else {}
    return p.fix, params, citations


def no_fix_reason(sig: Signature) -> str | None:
    """Why the class that fits ``sig`` fixes nothing (said instead of "no recipe covers"), or, for a failure
    no class fits, the class it came closest to; None when neither applies."""
    if isinstance(sig.details.get("no_fix"), str):
        return f"the {sig.kind} class fits but fixes nothing here: {sig.details['no_fix']}"
    if isinstance(sig.details.get("closest"), str):
        return (f"no recipe covers {sig.kind} (closest class: {sig.details['closest']}, which does not fit: "
                f"{sig.details.get('why_not', '')})")
    return None
