"""Agent step records: what the progress line, the SSE stream and trace.jsonl show."""

from __future__ import annotations

import time
from typing import Any


def step(agent: str, summary: str, **detail: Any) -> dict[str, Any]:
    return {"t": round(time.time(), 3), "agent": agent, "summary": summary, **({"detail": detail} if detail else {})}
