"""tuner: benchmarks the validated port and searches its configuration.

The walking skeleton records the harness's own timings of the validated run and the reference
run; the search over batch size, dtype, attention implementation, threads etc. plugs in here.
"""

from __future__ import annotations

from typing import Any

from agents.models import Tuning
from agents.trace import step


def tuner_node(state: dict[str, Any]) -> dict[str, Any]:
    runs = state.get("runs") or []
    port = next((r for r in reversed(runs) if r["purpose"] == "port" and r["ok"]), None)
    ref = next((r for r in runs if r["purpose"] == "reference" and r["ok"]), None)
    tuning = Tuning(status="skipped", detail="tuning not requested" if not state["request"].get("tune")
                    else "tuning is not available in this build; timings recorded from the validation runs")
    if port:
        tuning.tuned = {"run_s": (port.get("timings") or {}).get("run_s"), "target": port["target"]}
    if ref:
        tuning.baseline = {"run_s": (ref.get("timings") or {}).get("run_s"), "target": ref["target"]}
    return {"tuning": tuning.model_dump(mode="json"), "trace": [step("tuner", tuning.detail)]}
