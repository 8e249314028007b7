"""A guard around every graph node: an exception inside a node becomes a recorded failure in the
state instead of ending the run with a traceback and no bundle.

The failure record (``PortState.failure``) names the node, the error type and the first line of its
message; the full traceback is written to a file in the workspace (``<workdir>/failures/``, or the
npuport home before a workspace exists), never into the state. Routing then sends the run to the
reporter, which writes a partial bundle saying what failed and where. Everything the earlier nodes
computed stays in the state (the failed node's own update is simply absent).

Each node's outcome is also appended to ``PortState.messages`` as one AI message, so LangGraph
Studio's chat view and the chat API see the run as a conversation.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.errors import GraphBubbleUp

from agents.state import workdir_if_set
from agents.trace import step
from knowledge.errors import error_record, first_line
from knowledge.home import cache_dir

Node = Callable[[dict[str, Any]], dict[str, Any]]
Fallback = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def _traceback_dir(state: dict[str, Any]) -> Path:
    workdir = workdir_if_set(state)
    if workdir and workdir.is_dir():
        d = workdir / "failures"
        d.mkdir(exist_ok=True)
        return d
    return cache_dir("failures")


def save_traceback(node: str, exc: BaseException, state: dict[str, Any]) -> str | None:
    """Writes the traceback to a file; returns its path, or None when nothing could be written."""
    text = "".join(traceback.format_exception(exc))
    try:
        path = _traceback_dir(state) / f"{node}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}.txt"
        path.write_text(text)
        return str(path)
    except OSError:
        return None


def failure_record(node: str, exc: BaseException, state: dict[str, Any]) -> dict[str, Any]:
    """The failure in the state: the class tells a user's error or a port failure (an ``NpuportError``
    and its ``kind``) from a bug (anything else: kind ``internal``, ``expected`` false)."""
    return {"node": node, **error_record(exc, 500), "traceback": save_traceback(node, exc, state),
            "t": round(time.time(), 3)}


def failure_reason(failure: dict[str, Any]) -> str:
    """One line for the user: which step failed, with what, and where the traceback is."""
    where = f" (traceback: {failure['traceback']})" if failure.get("traceback") else ""
    return f"the {failure['node']} step failed: {failure['error']}: {failure['message']}{where}"


def _summary(node: str, update: dict[str, Any]) -> str:
    items = [t for t in update.get("trace") or [] if isinstance(t, dict)]
    if items:
        return f"{node}: {items[-1].get('summary', '')}"
    return f"{node}: done"


def guard(node: str, fn: Node, fallback: Fallback | None = None) -> Node:
    """``fn`` wrapped so that an exception becomes ``{"status": "failed", "failure": ...}``.

    ``fallback(state, failure)`` may add to that update (the reporter's guard writes an emergency
    report with it, since no node runs after the reporter). LangGraph's own control-flow exceptions
    (interrupts, GraphBubbleUp) pass through untouched."""

    @functools.wraps(fn)
    def guarded(state: dict[str, Any]) -> dict[str, Any]:
        try:
            update = fn(state)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            failure = failure_record(node, exc, state)
            reason = failure_reason(failure)
            out: dict[str, Any] = {"status": "failed", "reason": reason, "failure": failure,
                                   "trace": [step(node, reason, failure=failure)]}
            if fallback is not None:
                try:
                    out.update(fallback(state, failure))
                except Exception as again:  # the last resort failed too: the failure record still stands
                    out["reason"] = (f"{reason}; the emergency report failed too: {type(again).__name__}: "
                                     f"{first_line(again)}")
            out["messages"] = [AIMessage(content=f"{node} failed: {out['reason']}", name=node)]
            return out
        if not isinstance(update, dict):
            return update
        # The node's own messages (the reporter's reply to a chat) stay last, after the step summary.
        own = list(update.get("messages") or [])
        return {**update, "messages": [AIMessage(content=_summary(node, update), name=node), *own]}

    return guarded
