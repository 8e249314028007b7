"""The typed state of a port (DESIGN §3). Items are plain JSON-able dicts (the agents' pydantic
records, dumped) so checkpoints stay small and portable; large artefacts live in the workspace."""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

# typing_extensions' TypedDict: pydantic (Studio's schemas, the API) reads it on Python 3.11 too.
from typing_extensions import TypedDict


class PortState(TypedDict, total=False):
    goal: str
    """The user's goal text, e.g. "port the model in ./m to Ascend 910B and maximise throughput"."""
    request: dict[str, Any]
    """agents.request.PortRequest, dumped: model path, target, chip, budgets, output folder."""
    plan: dict[str, Any]
    """The planner's steps and the policy in charge."""
    target: dict[str, Any]
    """The resolved target (name, device, bootstrap, options, reason)."""
    environment: dict[str, Any]
    """The environment node's notes, the model's resolved pins and the layered venv's python (or None)."""
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
    """The patcher has applied the fixes planned from the static scan (later rounds fix diagnoses)."""
    numerics: dict[str, Any]
    """agents.models.Numerics: the validator's verdict."""
    perf: dict[str, Any]
    """agents.validation.perf_evidence.analyse: decode profiles (original and port) and performance pathologies."""
    tuning: dict[str, Any]
    """agents.models.Tuning: the tuner's trials, best configuration and measured speed-up."""
    bundle: dict[str, Any]
    """The reporter's output: folder, files written (report, patch, patched tree, deploy files), note."""
    deployment: dict[str, Any]
    """The deployment phase's outcome (agents/report/deployment.py deployment_brief): status, one-line summary and
    the bundle's deployment.json that holds the record."""
    counters: dict[str, int]
    """port_runs, reference_runs."""
    started_at: float
    """Wall-clock start of the port (time.time()), for the wall budget and the report."""
    status: str
    """running | failed | validated."""
    reason: str
    """One line: why the port ended as it did."""
    failure: dict[str, Any]
    """Set when a node raised (graph/guard.py): node, error (type name), kind (user | port | internal,
    from the error's class: the CLI's exit code), expected (an npuport error rather than a bug),
    message (first line), fields (the error's structured details), traceback (a file in the
    workspace; never in the state)."""
    trace: Annotated[list[dict[str, Any]], operator.add]
    """Agent steps, in order (progress lines, SSE events, trace.jsonl)."""
    messages: Annotated[list[AnyMessage], add_messages]
    """Chat messages, for the chat API and Studio: one AI message per node outcome (graph/guard.py)."""


class PortInput(TypedDict, total=False):
    """What a run takes (Studio's input form, the LangGraph API): a goal in words, or a chat message
    (the last human message is the goal), and/or structured fields; explicit fields win."""

    goal: str
    """e.g. "port the model in examples/ocr_mini to Ascend 910B on the cpu"."""
    model_path: str
    target: str
    """cpu | ascend-sim | npu | auto."""
    chip: str
    """910b | a3 | 310p."""
    tune: bool
    policy: str
    """rule | llm | hybrid."""
    out_dir: str
    request: dict[str, Any]
    """Any agents.request.PortRequest fields (these win over the flat fields above)."""
    messages: Annotated[list[AnyMessage], add_messages]
    """Studio's chat input: the last human message is read as the goal."""


class PortOutput(TypedDict, total=False):
    """What a run returns: the verdict, the bundle and an AI message summarising both."""

    status: str
    reason: str
    request: dict[str, Any]
    numerics: dict[str, Any]
    tuning: dict[str, Any]
    bundle: dict[str, Any]
    deployment: dict[str, Any]
    """The deployment phase's status and summary line, when it ran."""
    counters: dict[str, int]
    failure: dict[str, Any] | None
    """The node that failed and why, when one did (graph/guard.py)."""
    messages: Annotated[list[AnyMessage], add_messages]
