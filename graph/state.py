"""The typed state of a port (DESIGN §3). Items are plain JSON-able dicts (the agents' pydantic
records, dumped) so checkpoints stay small and portable; large artefacts live in the workspace."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages


class PortState(TypedDict, total=False):
    goal: str
    """The user's goal text, e.g. "port the model in ./m to Ascend 910B and maximise throughput"."""
    request: dict[str, Any]
    """agents.planner.PortRequest, dumped: model path, target, chip, budgets, output folder."""
    plan: dict[str, Any]
    """The planner's steps and the policy in charge."""
    target: dict[str, Any]
    """The resolved target (name, device, bootstrap, options, reason)."""
    environment: dict[str, Any]
    workdir: str
    """The workspace: model/ (git, one commit per patch) and runs/ (harness results)."""
    original_digest: str
    """sha256 over the user's original tree, taken when it was copied."""
    entry: dict[str, Any]
    """How to run the model: the manifest dict of docs/architecture.md."""
    findings: list[dict[str, Any]]
    """agents.models.Finding records from the static scan."""
    patches: Annotated[list[dict[str, Any]], operator.add]
    """agents.models.Patch records, in commit order."""
    runs: Annotated[list[dict[str, Any]], operator.add]
    """agents.models.RunRecord records, in run order."""
    diagnoses: Annotated[list[dict[str, Any]], operator.add]
    """agents.models.Diagnosis records from the debugger."""
    pending_diagnosis: dict[str, Any] | None
    """The diagnosis whose fix the patcher applies next."""
    static_fixes_done: bool
    numerics: dict[str, Any]
    """agents.models.Numerics: the validator's verdict."""
    perf: dict[str, Any]
    """agents.perf_evidence.analyse: decode profiles (original and port) and performance pathologies."""
    tuning: dict[str, Any]
    bundle: dict[str, Any]
    counters: dict[str, int]
    """port_runs, reference_runs."""
    started_at: float
    status: str
    """running | failed | validated."""
    reason: str
    """One line: why the port ended as it did."""
    trace: Annotated[list[dict[str, Any]], operator.add]
    """Agent steps, in order (progress lines, SSE events, trace.jsonl)."""
    messages: Annotated[list[AnyMessage], add_messages]
    """Chat messages, for the chat API and Studio."""
