"""The agents' reasoning as live progress: what the LLM said or decided in each exchange, and what the
rule policy decided when it is in charge (offline, or as the fallback). Sent on the graph's progress
stream (agents/progress.py), so the service stores it as ``progress`` events of kind ``reasoning``:
the job's SSE stream carries them and the chat API streams them as chunks. Outside a graph run it does
nothing."""

from __future__ import annotations

from typing import Any, Literal

from agents import progress

Source = Literal["llm", "rules"]
MAX_CHARS = 1200  # progress is for people watching; the full exchange is in the bundle's llm/ folder


def think(agent: str, source: Source, text: str, **data: Any) -> None:
    text = " ".join(text.split())
    if not text:
        return
    if len(text) > MAX_CHARS:
        text = text[: MAX_CHARS - 3] + "..."
    progress.emit("reasoning", agent=agent, source=source, text=text, **data)


def llm_turn_text(content: Any, tool_calls: list[dict[str, Any]], answer: str | None = None,
                  reasoning: str | None = None) -> str:
    """One LLM turn in words: its reasoning or text, the tools it called, the gist of its answer."""
    parts: list[str] = []
    if reasoning:
        parts.append(str(reasoning))
    if isinstance(content, list):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if content:
        parts.append(str(content))
    for call in tool_calls:
        args = call.get("args") or {}
        if call.get("name") == answer:
            parts.append(f"answers {answer}: {_gist(args)}")
        else:
            shown = ", ".join(f"{k}={str(v)[:80]!r}" for k, v in list(args.items())[:3])
            parts.append(f"calls {call.get('name')}({shown})")
    return "; ".join(parts)


def _gist(args: dict[str, Any]) -> str:
    """The human part of a structured answer: its summaries and messages, else the fields."""
    texts: list[str] = []
    for key in ("summary", "kind"):
        if isinstance(args.get(key), str) and args[key]:
            texts.append(args[key])
    for key in ("fixes", "findings", "trials"):
        items = args.get(key)
        if isinstance(items, list):
            shown = [str(i.get("summary") or i.get("message") or i) if isinstance(i, dict) else str(i)
                     for i in items[:4]]
            texts.append(f"{len(items)} {key}" + (": " + " | ".join(shown) if shown else ""))
    if not texts:
        texts.append(", ".join(f"{k}={v!r}" for k, v in args.items() if v not in (None, [], "")))
    return "; ".join(texts)


def why_failed(exc: BaseException) -> str:
    """Why an LLM step gave nothing, in words: a spent budget, a timeout, or the error."""
    from knowledge.errors import BudgetExhausted, first_line

    if isinstance(exc, BudgetExhausted):
        return first_line(exc, 200)
    name = type(exc).__name__
    if "Timeout" in name:
        return f"the LLM did not answer in time: {name}"
    return f"{name}: {first_line(exc, 200)}"
