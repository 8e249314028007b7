"""The deployment phase: after the reporter has written the validated bundle, vLLM serves the port with the
bundle's own serve.sh (agents/deploy/serving.py) and this phase adds what came of it to that bundle:
deployment.json, serve.sh's note, ``report.json["deployment"]`` and report.md rendered again (its summary's
Deployment bullet and its Deployment section).

The bundle exists whatever happens here: an interrupt, a timeout or a crash of the check leaves the bundle as
the reporter wrote it, whose report says the deployment has not run yet; the graph's ``deployer`` node, a
resume of its thread, and ``npuport deploy BUNDLE`` (``npuport bench BUNDLE``: the full throughput comparison)
run it again on the bundle alone.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.deploy.serve_report import PENDING, deployment_summary, serving_requested
from knowledge.errors import first_line

Phase = Callable[[str], None]


def deployment_due(report: dict[str, Any]) -> bool:
    """A validated port with serving on whose deployment has not run (or not finished)."""
    return (report.get("status") == "validated" and serving_requested(report)
            and (report.get("deployment") or {}).get("status") == PENDING)


def _run_root(source: dict[str, Any], bundle: Path) -> Path:
    """Where the check's sandboxed runs go: the port's workspace while it exists, else under the npuport home."""
    from agents.state import workdir_if_set

    workdir = workdir_if_set(source)
    if workdir and (workdir / "runs").is_dir():
        return workdir / "runs"
    from knowledge.home import npuport_home

    return npuport_home() / "deploy-runs" / bundle.resolve().name


def run_deployment(source: dict[str, Any], bundle: Path, *, bench: bool = False, on_phase: Phase | None = None,
                   tune: bool | None = None) -> dict[str, Any]:
    """Serve the bundle's port and record the result in the bundle; the deployment record. ``source``: the port's
    state, or the bundle's report.json (``npuport deploy``). ``bench``: the full side-by-side throughput comparison
    instead of the budgeted probe. A failure of the check itself (not the model's) is a failed deployment too,
    with its reason: it never takes the bundle with it."""
    from agents.deploy.bundle import serve_writer
    from agents.deploy.check_plan import FULL, PROBE
    from agents.deploy.serving import exercise

    report = json.loads((bundle / "report.json").read_text())
    state = {**report, **{k: v for k, v in source.items() if v is not None}}
    try:
        record = exercise(state, bundle, _run_root(state, bundle), plan=FULL if bench else PROBE,
                          write_serve=serve_writer(state, bundle), on_phase=on_phase, tune=tune)
    except Exception as exc:  # the check broke (a bug, a broken host): the bundle stays, the record says why
        record = {"status": "failed", "error": f"the deployment check itself failed: {type(exc).__name__}: "
                                               f"{first_line(exc)}", "traceback": traceback.format_exc()[-4000:]}
    record_deployment(bundle, record)
    return record


def record_deployment(bundle: Path, record: dict[str, Any]) -> None:
    """deployment.json, serve.sh's note, report.json's ``deployment`` and report.md, from the record."""
    from agents.deploy.bundle import mark_serve_sh
    from agents.report.bundle import bundle_markdown

    (bundle / "deployment.json").write_text(json.dumps(record, indent=1, default=str))
    if (bundle / "serve.sh").is_file():
        mark_serve_sh(bundle, record)
    report = json.loads((bundle / "report.json").read_text())
    report["deployment"] = record
    (bundle / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (bundle / "report.md").write_text(bundle_markdown(report, bundle))


def deployment_brief(record: dict[str, Any], bundle: Path) -> dict[str, Any]:
    """What the state keeps of the deployment (the record itself is the bundle's deployment.json)."""
    return {"status": record.get("status"), "summary": deployment_summary(record),
            "file": str(bundle / "deployment.json")}
