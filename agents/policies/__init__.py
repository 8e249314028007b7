"""Policies decide what the agents do: the rule policy (offline, default), the LLM policy, or the
hybrid (rules first, the LLM when no recipe helps).

``POLICIES`` (declared with PortRequest, agents/request.py) is the one list of their names. Importing this package is
cheap: the rule policy (libcst, the hazard rules) and the LLM policies (langchain) load when first asked for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agents.policies.base import Policy, PolicyContext, policy_context

if TYPE_CHECKING:
    from agents.policies.rule import RulePolicy

from agents.request import LLM_POLICIES, POLICIES  # the one list of names (PortRequest's choice)


def get_policy(name: str = "rule", context: PolicyContext | None = None) -> Policy:
    """``context`` (the port's workspace) lets the LLM policy's tools read the model; the rule policy
    needs none. The LLM policies import langchain lazily, so ``rule`` stays light."""
    if name == "rule":
        from agents.policies.rule import RulePolicy

        return RulePolicy()
    if name in LLM_POLICIES:
        if name == "llm":
            from agents.policies.llm import LLMPolicy

            return LLMPolicy(context=context)
        from agents.policies.hybrid import HybridPolicy

        return HybridPolicy(context=context)
    raise ValueError(f"unknown policy {name!r}; available: {', '.join(POLICIES)}")


def __getattr__(name: str) -> Any:  # RulePolicy on first use (PEP 562): libcst stays out of the CLI's start
    if name == "RulePolicy":
        from agents.policies.rule import RulePolicy

        return RulePolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LLM_POLICIES", "POLICIES", "Policy", "PolicyContext", "RulePolicy", "get_policy",
           "policy_context"]
