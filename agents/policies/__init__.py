"""Policies decide what the agents do: the rule policy (offline, default), the LLM policy, or the
hybrid (rules first, the LLM when no recipe helps)."""

from __future__ import annotations

from agents.policies.base import FixAction, Policy, PolicyContext, policy_context
from agents.policies.rule import RulePolicy

POLICIES = ("rule", "llm", "hybrid")


def get_policy(name: str = "rule", context: PolicyContext | None = None) -> Policy:
    """``context`` (the port's workspace) lets the LLM policy's tools read the model; the rule policy
    needs none. The LLM policies import langchain lazily, so ``rule`` stays light."""
    if name == "rule":
        return RulePolicy()
    if name in ("llm", "hybrid"):
        from agents.policies.llm import HybridPolicy, LLMPolicy

        return LLMPolicy(context=context) if name == "llm" else HybridPolicy(context=context)
    raise ValueError(f"unknown policy {name!r}; available: {', '.join(POLICIES)}")


__all__ = ["POLICIES", "FixAction", "Policy", "PolicyContext", "RulePolicy", "get_policy", "policy_context"]
