"""The graph's schemas: the state (``PortState``, its fields and their readers in agents/state.py), what a
run takes (``PortInput``: Studio's form, the LangGraph API) and what it returns (``PortOutput``). Items are
plain JSON-able dicts (the agents' pydantic records, dumped) so checkpoints stay small and portable; large
artefacts live in the workspace."""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

# typing_extensions' TypedDict: pydantic (Studio's schemas, the API) reads it on Python 3.11 too.
from typing_extensions import TypedDict

from agents.state import PortFields


class PortState(PortFields, total=False):
    """The graph's state: the port's fields (agents/state.py, each with its reader) and the chat."""

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
