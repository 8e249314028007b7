"""The graph's schemas: the state (``PortState``, its fields and their readers in agents/state.py), what a
run takes (``PortInput``: Studio's form, the LangGraph API) and what it returns (``PortOutput``). Items are
plain JSON-able dicts (the agents' pydantic records, dumped) so checkpoints stay small and portable; large
artefacts live in the workspace."""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages
from pydantic import Field

# typing_extensions' TypedDict: pydantic (Studio's schemas, the API) reads it on Python 3.11 too.
from typing_extensions import TypedDict

from agents.request import request_fields
from agents.state import PortFields


class PortState(PortFields, total=False):
    """The graph's state: the port's fields (agents/state.py, each with its reader) and the chat."""

    messages: Annotated[list[AnyMessage], add_messages]
    """Chat messages, for the chat API and Studio: one AI message per node outcome (graph/guard.py)."""


def _request_keys() -> dict[str, Any]:
    """PortRequest's fields as flat input keys (Studio's form): each one's type and description."""
    return {name: Annotated[typ, Field(description=info.description)]
            for name, (typ, info) in request_fields(partial=True).items()}


_INPUT_KEYS: dict[str, Any] = {
    "goal": Annotated[str, Field(description="e.g. \"port the model in examples/ocr_mini to Ascend 910B on "
                                             "the cpu\"")],
    **_request_keys(),
    "request": Annotated[dict[str, Any], Field(description="agents.request.PortRequest fields (these win over "
                                                           "the flat ones)")],
    "messages": Annotated[list[AnyMessage], add_messages]}
PortInput = TypedDict("PortInput", _INPUT_KEYS, total=False)  # type: ignore[misc]
"""What a run takes (Studio's input form, the LangGraph API): a goal in words, or a chat message (the last
human message is the goal), and/or structured fields, flat (every field of agents.request.PortRequest,
derived from it) or as ``request``; explicit fields win over the goal's words."""


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
