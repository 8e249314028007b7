"""deployer: the deployment phase, after the reporter has written the validated bundle. vLLM serves the port
with the bundle's serve.sh (server start, the three-way token gate, a short throughput probe: the budget of
agents/deploy/check_plan.py) and the phase adds deployment.json and its report section to the bundle
(agents/report/deployment.py). The port's verdict stays the validator's: a deployment that fails is reported,
not a failed port. Interrupted, the bundle stands and a resume (or `npuport deploy BUNDLE`) runs this again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.progress import emit
from agents.report.deployment import deployment_brief, run_deployment
from agents.request import request_of
from agents.state import bundle_of
from agents.trace import step


def deployer_node(state: dict[str, Any]) -> dict[str, Any]:
    folder = bundle_of(state).dir
    bundle = Path(folder)
    if not folder or not (bundle / "report.json").is_file():
        return {"trace": [step("deployer", "no bundle to deploy")]}
    record = run_deployment(state, bundle, bench=request_of(state).bench,
                            on_phase=lambda text: emit("phase", text=text, node="deployer"))
    brief = deployment_brief(record, bundle)
    item = step("deployer", f"deployment: {brief['summary']}", deployment_status=brief["status"])
    with (bundle / "trace.jsonl").open("a") as fh:  # the bundle's trace ends with its deployment too
        fh.write(json.dumps(item, default=str) + "\n")
    return {"deployment": brief, "trace": [item]}
