"""code_reader: copies the model into the workspace, scans it for hazards (libcst) with file:line
evidence and citations, and finds how to run it (npuport.yaml, or config.json + auto_map)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.llm.assist import llm_enabled, review_code
from agents.llm.client import save_records
from agents.models import Finding
from agents.reading.citations import cite_findings, kb_status
from agents.reading.entry import discover_entry
from agents.reading.scanner import scan_tree
from agents.request import new_run_id, request_of
from agents.state import plan_of, workdir_if_set
from agents.trace import step
from agents.workspace import Workspace, tree_digest
from knowledge.errors import EntryNotFound, WorkspaceError
from knowledge.home import npuport_home


def code_reader_node(state: dict[str, Any]) -> dict[str, Any]:
    req = request_of(state)
    original = Path(req.model_path)
    workdir = workdir_if_set(state) or npuport_home() / "workspaces" / new_run_id(req.model_path)
    py_files = [p for p in original.rglob("*.py") if ".git" not in p.parts]
    if not py_files:
        reason = f"{original} holds no Python files, so there is no model source to port"
        return {"status": "failed", "reason": reason, "trace": [step("code_reader", reason)]}
    try:
        ws = Workspace.create(original, workdir)
    except WorkspaceError as exc:
        return {"status": "failed", "reason": str(exc), "trace": [step("code_reader", str(exc))]}
    scan = scan_tree(ws.model_dir)
    findings = cite_findings([f.model_dump(mode="json") for f in scan.findings])
    if scan.parse_errors:
        first = scan.parse_errors[0]
        reason = f"syntax error in the model: {first}"
        return {"status": "failed", "reason": reason, "workdir": str(workdir), "findings": findings,
                "original_digest": tree_digest(original), "trace": [step("code_reader", reason)]}
    try:
        entry = discover_entry(ws.model_dir)
    except EntryNotFound as exc:
        reason = f"cannot find how to run the model: {exc}"
        return {"status": "failed", "reason": reason, "workdir": str(workdir), "findings": findings,
                "original_digest": tree_digest(original), "trace": [step("code_reader", reason)]}
    update: dict[str, Any] = {}
    llm_trace = []
    plan = plan_of(state)
    if plan.llm_records:
        save_records(workdir, plan.llm_records)
        update["plan"] = plan.model_dump(mode="json", exclude={"llm_records"})
    if llm_enabled(req.policy):
        extra, note = review_code(workdir, [Finding(**f) for f in findings], only_unclassified=req.policy == "hybrid")
        findings += cite_findings([f.model_dump(mode="json") for f in extra])
        llm_trace.append(step("code_reader", note, llm=True,
                              llm_findings=[f"{f.file}:{f.line} {f.hazard}" for f in extra]))
    by_hazard: dict[str, int] = {}
    for f in findings:
        by_hazard[f["hazard"]] = by_hazard.get(f["hazard"], 0) + 1
    hz = ", ".join(f"{h} x{n}" for h, n in sorted(by_hazard.items(), key=lambda kv: int(kv[0][1:]))) or "none"
    return {
        **update,
        "workdir": str(workdir),
        "original_digest": tree_digest(original),
        "findings": findings,
        # The guesses behind the entry (inputs synthesised and why, ...) travel with it to the report.
        "entry": {**entry.as_manifest_dict(), "assumptions": list(entry.assumptions)},
        "trace": [step("code_reader", f"{len(findings)} hazard finding(s) in {len(scan.files)} file(s): {hz}; "
                       f"entry {entry.kind}; knowledge base: {kb_status()}", entry_kind=entry.kind,
                       assumptions=list(entry.assumptions)), *llm_trace],
    }
