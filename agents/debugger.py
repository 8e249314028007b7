"""Compatibility alias: the failure classifier moved to agents/diagnosis.py and the debugger node to
agents/nodes/debugger.py. Only agents/policies/rule.py still imports this path (it is being rewritten
in the hazard-rules work); delete this module once it imports ``agents.diagnosis``."""

from __future__ import annotations

from agents.diagnosis import Signature, budget_left, classify, innermost_model_frame

__all__ = ["Signature", "budget_left", "classify", "innermost_model_frame"]
