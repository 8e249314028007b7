"""Sandbox runs as records: a harness result turned into a RunRecord, and the limits a request sets."""

from __future__ import annotations

from typing import Any

from agents.models import Frame, RunRecord, StructuredException
from sandbox.process import Limits
from sandbox.runner import HarnessRun


def _exception(result: dict[str, Any]) -> StructuredException | None:
    exc = result.get("exception")
    if not exc:
        return None
    return StructuredException(type=exc.get("type", "Exception"), message=exc.get("message", ""),
                               frames=[Frame(**f) for f in exc.get("frames") or []])


def record_of(run: HarnessRun, run_id: str, purpose: str, target: str) -> RunRecord:
    res = run.result
    outputs = res.get("outputs") or {}
    status = run.status
    return RunRecord(
        id=run_id, purpose=purpose, target=target, ok=run.ok,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        wall_s=round(run.exec_result.wall_s, 3), result_path=str(run.run_dir / "result.json"),
        outputs_digest=outputs.get("digest", ""), tokens=outputs.get("tokens"), timings=res.get("timings") or {},
        exception=_exception(res), warnings=res.get("warnings") or [], op_stats=res.get("op_stats") or {},
        isolation=run.exec_result.isolation, shrunk=res.get("shrunk"), inputs=res.get("inputs"),
    )


def limits_for(req: dict[str, Any]) -> Limits:
    return Limits(wall_s=float(req.get("run_timeout_s", 300)))


def token_summary(tokens: list[list[int]] | None, edge: int = 6) -> str:
    """Token rows for a person to read: a long row (a prompt of image tokens) keeps its first and last
    ``edge`` ids and says how many it leaves out; report.json keeps them all."""
    if tokens is None:
        return "None"
    rows = []
    for row in tokens:
        if len(row) <= 3 * edge:
            rows.append(str(list(row)))
        else:
            head, tail = ", ".join(map(str, row[:edge])), ", ".join(map(str, row[-edge:]))
            rows.append(f"[{head}, ... {len(row) - 2 * edge} more ..., {tail}] ({len(row)} ids)")
    return "[" + ", ".join(rows) + "]"

