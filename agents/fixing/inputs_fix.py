"""The debugger's inputs fix (hazard H26, ``rebuild-inputs``): a run failed on the generate path for want of an
input the model's own code builds, so later runs (the port's and the reference's alike) build their inputs
with that code. It is a change of the run's manifest (``run.rebuild_inputs``), not of the model's code: no
commit, and the trace and the report say so."""

from __future__ import annotations

from typing import Any

from agents.models import Diagnosis
from agents.rules.h26_generate_inputs import INPUTS_FIX
from agents.state import entry_of
from agents.trace import step

__all__ = ["INPUTS_FIX", "apply_inputs_fix"]


def apply_inputs_fix(state: dict[str, Any], diagnosis: Diagnosis) -> dict[str, Any]:
    """The state update that makes later runs rebuild their inputs with the model's own code; a failed port
    when they already did (the fix would change nothing)."""
    entry = entry_of(state)
    run = dict(entry.get("run") or {})
    p = diagnosis.params
    fix = {"needs": sorted({str(n) for n in p.get("needs") or []}),
           "token": p.get("token") if isinstance(p.get("token"), int) else None,
           "why": str(p.get("why") or diagnosis.summary)[:300], "diagnosis": diagnosis.id}
    before = run.get("rebuild_inputs") or {}
    out: dict[str, Any] = {"static_fixes_done": True, "pending_diagnosis": None, "patches": []}
    if before and before.get("needs") == fix["needs"] and before.get("token") == fix["token"]:
        out["status"] = "failed"
        out["reason"] = (f"could not port because {diagnosis.summary}, and the inputs were already rebuilt with the "
                         "model's own input-building code")
        out["trace"] = [step("patcher", f"{INPUTS_FIX}: the inputs were already rebuilt; nothing left to change")]
        return out
    run["rebuild_inputs"] = fix
    entry["run"] = run
    needs = ", ".join(fix["needs"]) or (f"token {fix['token']}" if fix["token"] is not None else "its inputs")
    out["entry"] = entry
    out["trace"] = [step("patcher",
                         f"{INPUTS_FIX} (an inputs fix, not a code patch): later runs build {needs} with the "
                                    f"model's own input-building code ({fix['why']})")]
    return out
