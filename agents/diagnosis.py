"""Diagnosis skills: a failed run's structured exception as a failure signature, and the port's budget.

Signatures are pure functions of the exception (type, message, innermost model frame), so the same
failure twice is recognised as the same and loops are detected.
"""

from __future__ import annotations

import time
from typing import Any

# The failure classifier lives with the hazard rules (agents/rules/diagnose.py); re-exported here.
from agents.rules.base import Signature
from agents.rules.diagnose import classify, innermost_model_frame

__all__ = ["Signature", "budget_left", "classify", "innermost_model_frame"]


def budget_left(state: dict[str, Any]) -> tuple[bool, str]:
    """(True, "") while the run may continue, else (False, which budget ran out)."""
    req = state["request"]
    runs = (state.get("counters") or {}).get("port_runs", 0)
    if runs >= req.get("max_runs", 8):
        return False, f"the budget of {req.get('max_runs')} sandbox runs is spent"
    started = state.get("started_at") or time.time()
    if time.time() - started >= req.get("max_wall_s", 1800):
        return False, f"the wall-time budget of {req.get('max_wall_s'):g} s is spent"
    return True, ""
