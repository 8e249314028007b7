"""executor: runs the patched model in a sandbox on the target and records the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.runs import limits_for, record_of, token_summary
from agents.target_state import target_from_dict
from agents.trace import step
from agents.workspace import Workspace
from sandbox.runner import run_harness


def executor_node(state: dict[str, Any]) -> dict[str, Any]:
    req = state["request"]
    ws = Workspace(Path(state["workdir"]))
    target = target_from_dict(state["target"])
    counters = dict(state.get("counters") or {})
    n = counters.get("port_runs", 0) + 1
    run_id = f"run-{n}"
    run = run_harness(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / run_id,
                      manifest=state["entry"], target=target, limits=limits_for(req),
                      extra={"capture": ["__step__", "*"], "shrink": bool(req.get("shrink"))},
                      python=(state.get("environment") or {}).get("python"))
    rec = record_of(run, run_id, "port", target.name)
    counters["port_runs"] = n
    if rec.ok:
        text = (run.result.get("outputs") or {}).get("text")
        summary = f"{run_id} on {target.name}: ok in {rec.wall_s:.1f} s, tokens {token_summary(rec.tokens)}" + (f" {text!r}" if text else "")
    else:
        exc = rec.exception
        where = next((f"{f.file}:{f.line}" for f in reversed(exc.frames) if f.in_model), "") if exc else ""
        summary = f"{run_id} on {target.name}: {rec.status}: {exc.type if exc else ''}: {(exc.message if exc else '')[:200]}" + (
            f" at {where}" if where else "")
    return {"runs": [rec.model_dump(mode="json")], "counters": counters, "trace": [step("executor", summary)]}
