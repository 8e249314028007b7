"""Policies decide what the agents do: the rule policy (offline, default) or the LLM policy."""

from __future__ import annotations

from agents.policies.base import FixAction, Policy
from agents.policies.rule import RulePolicy


def get_policy(name: str = "rule") -> Policy:
    if name == "rule":
        return RulePolicy()
    raise ValueError(f"unknown policy {name!r}; available: rule")


__all__ = ["FixAction", "Policy", "RulePolicy", "get_policy"]
