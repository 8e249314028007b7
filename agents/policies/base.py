"""The policy interface shared by the rule (offline) policy and the LLM policy.

A policy decides; skills (scanner, codemods, sandbox) act. Both policies return the same typed
records, so the graph does not care which one is in charge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agents.models import Diagnosis, Finding, FixAction, StructuredException
from agents.request import PortRequest, request_of
from agents.state import entry_of, target_if_resolved, workdir_if_set
from sandbox.targets import Target


class Policy(Protocol):
    """What the patcher and the debugger ask a policy (``get_policy`` is the one way to get one). The
    LLM policies, and the planner, code reader and tuner (agents/llm/assist.py), all reach the LLM
    through one client (agents/llm/client.py) asking the roles of agents/llm/roles/."""

    name: str
    notes: list[str]
    """What the policy said while deciding, one line each (the node puts them in the trace)."""

    def plan_fixes(self, findings: list[Finding]) -> list[FixAction]:
        """Patches to make before the first run, from the static findings."""
        ...

    def diagnose(self, run_id: str, exception: StructuredException, history: list[Diagnosis]) -> Diagnosis:
        """Classify a failed run and name the fix, or no fix."""
        ...

    def fix_for(self, diagnosis: Diagnosis) -> FixAction | None:
        ...


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may look at besides its arguments: the port's workspace and how to run it.
    The rule policy ignores it; the LLM policy's tools (read_file, grep, run_in_sandbox) need it."""

    workdir: Path | None = None
    entry: dict[str, Any] = field(default_factory=dict)
    target: Target | None = None
    request: PortRequest | None = None

    @property
    def model_dir(self) -> Path | None:
        return self.workdir / "model" if self.workdir else None


def policy_context(state: dict[str, Any]) -> PolicyContext:
    """The context of a port, from the graph state (nodes pass it to ``get_policy``)."""
    return PolicyContext(workdir=workdir_if_set(state), entry=entry_of(state), target=target_if_resolved(state),
                         request=request_of(state))
