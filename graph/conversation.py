"""The graph's two conversational edges: a run may start from chat messages (Studio's chat input, the
last human message is the goal) or from flat fields (Studio's form), and it ends with an AI message
that summarises the result. Wrapped around the planner and the reporter so the agents stay unaware."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from agents.request import PortRequest
from agents.state import (
    bundle_of,
    deployment_of,
    goal_of,
    messages_of,
    numerics_of,
    patches_of,
    reason_of,
    request_fields_of,
    status_of,
    tuning_of,
)
from graph.state import PortInput, PortState

Node = Callable[[dict[str, Any]], dict[str, Any]]
FLAT_FIELDS = tuple(PortRequest.model_fields)
"""The request fields a caller may give as flat input keys (graph/state.py ``PortInput``)."""


class PlannerInput(PortState, PortInput, total=False):  # type: ignore[misc, valid-type]
    """The planner reads the input-only fields too (a node sees only its input schema's keys)."""


def _text(message: Any) -> str:
    content = message.content if isinstance(message, BaseMessage) else (message or {}).get("content")
    if isinstance(content, list):  # multimodal content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def _is_human(message: Any) -> bool:
    kind = message.type if isinstance(message, BaseMessage) else (message or {}).get("type") or message.get("role")
    return kind in ("human", "user")


def normalise_input(state: dict[str, Any]) -> dict[str, Any]:
    """goal and request as the planner reads them, from whichever input the caller used."""
    goal = goal_of(state)
    if not goal:
        humans = [m for m in messages_of(state) if _is_human(m)]
        goal = _text(humans[-1]).strip() if humans else ""
    # the form's flat fields are input keys (PortInput), not fields of the state
    request = {k: state[k] for k in FLAT_FIELDS if state.get(k) not in (None, "")}
    request.update(request_fields_of(state))
    return {**state, "goal": goal, "request": request}


def with_input(planner: Node) -> Node:
    def planner_node(state: dict[str, Any]) -> dict[str, Any]:
        norm = normalise_input(state)
        out = planner(norm)
        # keep what the caller asked for in the state even when the planner could not parse it
        out.setdefault("request", request_fields_of(norm))
        if goal_of(norm) and not goal_of(state):
            out["goal"] = goal_of(norm)
        return out

    return planner_node


def summary(state: dict[str, Any]) -> str:
    status = status_of(state) or "failed"
    lines = [f"**{status}**: {reason_of(state)}".rstrip()]
    numerics = numerics_of(state)
    if numerics is not None:
        lines.append(f"validation: {numerics.verdict}")
    patches = patches_of(state)
    if patches:
        lines.append(f"{len(patches)} patches: " + "; ".join(p.summary for p in patches[:8]))
    tuned = tuning_of(state).tuned
    if tuned.get("speedup"):
        vs = tuned.get("vs_original")
        said = {"slower": " (SLOWER than the original)",
                "not comparable": f" (not comparable on this host: spread {float(tuned.get('spread') or 0):.0%})"}
        lines.append(f"tuned: {tuned['tokens_per_s']:.1f} tokens/s, {tuned['speedup']:.2f}x the original"
                     f"{said.get(str(vs), '')}")
    bundle = bundle_of(state)
    deployment = deployment_of(state)
    if deployment is not None and deployment.summary:
        lines.append(f"deployment: {deployment.summary}")
    elif bundle.dir and (pending := _pending_deployment(bundle.dir)):
        lines.append(f"deployment: {pending}")
    if bundle.dir:
        lines.append(f"bundle: {bundle.dir} (report.md, port.patch)")
    if bundle.note:
        lines.append(f"note: {bundle.note}")
    return "\n".join(lines)


def _pending_deployment(bundle: str) -> str | None:
    """The bundle's deployment line while its deployment phase has not run (the reporter's reply)."""
    import json
    from pathlib import Path

    from agents.deploy.serve_report import PENDING, deployment_summary

    report = Path(bundle) / "report.json"
    try:
        record = json.loads(report.read_text()).get("deployment") or {}
    except (OSError, ValueError):
        return None
    if record.get("status") == PENDING:
        return "the deployment check (vLLM serving the port) follows now"
    return deployment_summary(record) if record else None


def with_reply(reporter: Node) -> Node:
    def reporter_node(state: dict[str, Any]) -> dict[str, Any]:
        out = reporter(state)
        return {**out, "messages": [AIMessage(content=summary({**state, **out}), name="npuport")]}

    return reporter_node
