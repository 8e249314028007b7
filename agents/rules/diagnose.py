"""Failure signatures: a failed run's structured exception -> a stable signature, and the fix and
citation that the hazard rule explaining it names. The rules' own error patterns are tried first, then
the generic kinds (missing module, timeout, out of memory, crash, shape mismatch, any exception)."""

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
        return Signature("missing-module", f"missing-module:{root}@{where}",
                         f"the model imports {mm.group(1)}, which is not installed here ", frame)
    if exc.type == "Timeout":
        return Signature("timeout", "timeout", exc.message, frame)
    if exc.type in ("OutOfMemoryError",) or "out of memory" in msg.lower():
        return Signature("oom", f"oom@{where}", f"out of memory at {where}", frame)
    if exc.type == "ProcessDied":
        return Signature("crash", "crash", exc.message, frame)
    if exc.type in ("RuntimeError", "ValueError") and re.search(r"size|shape|dimension", msg):
        return Signature("shape-mismatch", f"shape-mismatch@{where}", f"a shape mismatch at {where}: {msg[:160]}",
                         frame)
    return Signature("exception", f"exception:{exc.type}@{where}", f"{exc.type} at {where}: {msg[:200]}", frame)


def explain(sig: Signature, registry: Registry | None = None) -> tuple[str | None, dict[str, Any], list[Citation]]:
    """(codemod, params, citations) that the rule explaining ``sig`` names; (None, {}, []) when none does."""
    found = (registry or active()).pattern(sig.kind)
    if found is None:
        return None, {}, []
    rule, p = found
    if (p.needs_frame and sig.frame is None) or (p.fix_if is not None and not p.fix_if(sig)):
        return None, {}, []
    params = p.params(sig) if p.params is not None and p.fix else {}
    return p.fix, params, [Citation(source=rule.topic, title=p.title)]
