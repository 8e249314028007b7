"""executor: runs the patched model in a sandbox on the target and records the run."""

from __future__ import annotations

from typing import Any

from agents.request import request_of
from agents.runs import STEP_CAPTURE, record_of, run_spec, token_summary
from agents.sites import port_site
from agents.state import counters_of, workdir_of
from agents.trace import step
from agents.workspace import Workspace


def executor_node(state: dict[str, Any]) -> dict[str, Any]:
    spec = run_spec(state).replace(capture=STEP_CAPTURE)
    ws = Workspace(workdir_of(state))
    target = spec.target
    counters = counters_of(state)
    counters.port_runs += 1
    run_id = f"run-{counters.port_runs}"
    run = spec.harness(ws.runs_dir / run_id)
    rec = record_of(run, run_id, "port", target.name)
    if rec.ok:
        text = (run.result.get("outputs") or {}).get("text")
        produced = (f"tokens {token_summary(rec.tokens)}" if rec.tokens is not None or not rec.output_tensors else
                    "outputs " + ", ".join(f"{k} {tuple(v.get('shape') or [])}" for k, v in rec.output_tensors.items()))
        summary = f"{run_id} on {target.name}: ok in {rec.wall_s:.1f} s, {produced}" + (f" {text!r}" if text else "")
    else:
        exc = rec.exception
        where = next((f"{f.file}:{f.line}" for f in reversed(exc.frames) if f.in_model), "") if exc else ""
        where = port_site(where, ws.root, request_of(state).model_path) or ""  # the user's line
        summary = (f"{run_id} on {target.name}: {rec.status}: {exc.type if exc else ''}: "
                   f"{(exc.message if exc else '')[:200]}" + (f" at {where}" if where else ""))
    return {"runs": [rec.model_dump(mode="json")], "counters": counters.model_dump(),
            "trace": [step("executor", summary)]}
