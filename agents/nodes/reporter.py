"""reporter: writes the bundle (port.patch, patched tree, report.md, report.json, trace.jsonl)
and decides the final status. A bundle is written for failed ports too: it says what is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.report.bundle import bundle_conflict, default_out_dir, final_status, home_bundle_dir, write_bundle
from agents.state import workdir_if_set
from agents.trace import step


def reporter_node(state: dict[str, Any]) -> dict[str, Any]:
    status, reason = final_status(state)
    out_dir = default_out_dir(state)
    if status == "validated":
        from agents.reading.citations import record_validated_fixes

        record_validated_fixes(state)
    note = ""
    if conflict := bundle_conflict(out_dir, state):  # never another bundle or a user's files
        out_dir = home_bundle_dir(state)
        note = f"{conflict}; wrote this port's bundle to {out_dir}"
    try:
        bundle = write_bundle(state, out_dir, status, reason)
    except OSError as exc:
        # A read-only or full output folder must not lose the report: write it beside the workspace.
        workdir = workdir_if_set(state)
        fallback = workdir / "bundle" if workdir else Path.cwd() / "npuport-report"
        note = f"cannot write the bundle to {out_dir}: {exc.strerror or exc}; wrote it to {fallback}"
        status, reason = "failed", note
        bundle = write_bundle(state, fallback, status, reason)
    bundle["note"] = note
    where = f"bundle in {bundle['dir']}" + (f" ({note})" if note and status != "failed" else "")
    return {"status": status, "reason": reason, "bundle": bundle,
            "trace": [step("reporter", f"{status}: {reason}; {where}")]}
