"""reporter: writes the bundle (port.patch, patched tree, report.md, report.json, trace.jsonl)
and decides the final status. A bundle is written for failed ports too: it says what is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.report import default_out_dir, final_status, write_bundle
from agents.trace import step


def reporter_node(state: dict[str, Any]) -> dict[str, Any]:
    status, reason = final_status(state)
    out_dir = default_out_dir(state)
    if status == "validated":
        from agents.citations import record_validated_fixes

        record_validated_fixes(state)
    note = ""
    try:
        bundle = write_bundle(state, out_dir, status, reason)
    except OSError as exc:
        # A read-only or full output folder must not lose the report: write it beside the workspace.
        fallback = Path(state["workdir"]) / "bundle" if state.get("workdir") else Path.cwd() / "npuport-report"
        note = f"cannot write the bundle to {out_dir}: {exc.strerror or exc}; wrote it to {fallback}"
        status, reason = "failed", note
        bundle = write_bundle(state, fallback, status, reason)
    bundle["note"] = note
    return {"status": status, "reason": reason, "bundle": bundle,
            "trace": [step("reporter", f"{status}: {reason}; bundle in {bundle['dir']}")]}
