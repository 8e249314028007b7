"""Chat answers about the job a conversation is bound to, read from the job's own report.json:
what changed, why, and what is left. No LLM: the report is the source of every sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agents.validation.perf_evidence import shown_where
from api.jobs import TERMINAL, Job

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("left", r"\b(left|remain\w*|todo|to do|not (?:fixed|changed|done)|still|open issues?|blockers?)\b"),
    ("why", r"\bwhy\b|\breason\b"),
    ("changed", r"\b(chang\w*|patch\w*|diff|modif\w*|edit\w*|fix\w*|did you do)\b"),
)


def question_of(text: str) -> str | None:
    """"changed" / "why" / "left" when the message asks that about its job, else None."""
    t = text.lower()
    return next((kind for kind, pattern in QUESTIONS if re.search(pattern, t)), None)


def _report(job: Job) -> dict[str, Any] | None:
    path = Path(job.bundle_dir) / "report.json" if job.bundle_dir else None
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def answer(job: Job, kind: str) -> str:
    report = _report(job)
    if report is None:
        state = "has not written its report yet" if job.status not in TERMINAL else "has no report"
        return f"job `{job.id}` is {job.status} and {state}; ask again when it ends (or ask for its status)."
    return {"changed": _changed, "why": _why, "left": _left}[kind](job, report)


def _changed(job: Job, report: dict[str, Any]) -> str:
    patches = report.get("patches") or []
    if not patches:
        return f"job `{job.id}`: I changed nothing in the model ({report.get('status')}: {report.get('reason')})."
    lines = [f"job `{job.id}`: {len(patches)} change(s), one commit each (the whole diff is port.patch in the bundle):"]
    for p in patches:
        lines.append(f"- {p.get('summary')} — files: {', '.join(p.get('files') or []) or '-'}")
    return "\n".join(lines)


def _why(job: Job, report: dict[str, Any]) -> str:
    res = report.get("resolutions") or {}
    by_id = {f["id"]: f for f in report.get("findings") or []}
    fixed = [(by_id[fid], why) for fid, why in res.items() if fid in by_id and str(why).startswith("fixed by")]
    lines = [f"job `{job.id}` is {report.get('status')}: {report.get('reason')}"]
    for f, why in fixed[:10]:
        lines.append(f"- {f['file']}:{f['line']} {f['hazard']} ({f['category']}): {f['message']} — {why}")
    if len(fixed) > 10:
        lines.append(f"- and {len(fixed) - 10} more fixes (report.json `resolutions`)")
    numerics = report.get("numerics") or {}
    if numerics.get("verdict"):
        lines.append(f"validation: {numerics['verdict']} — {numerics.get('detail', '')}")
    return "\n".join(lines)


def _left(job: Job, report: dict[str, Any]) -> str:
    res = report.get("resolutions") or {}
    left = [f for f in report.get("findings") or [] if str(res.get(f["id"], "")).startswith(("NOT changed", "left as"))]
    found = (report.get("perf") or {}).get("pathologies") or []
    if not left and not found and report.get("status") == "validated":
        return f"job `{job.id}`: nothing is left: it validated and every finding was fixed."
    lines = [f"job `{job.id}` ({report.get('status')}): what is left"]
    if report.get("status") != "validated":
        lines.append(f"- the port did not validate: {report.get('reason')}")
    order = {"blocks running": 0, "changes numbers": 1, "slows down": 2}
    for f in sorted(left, key=lambda f: order.get(f.get("category"), 3))[:10]:
        lines.append(f"- {f['file']}:{f['line']} {f['hazard']} ({f['category']}): {res.get(f['id'])}")
    if len(left) > 10:
        lines.append(f"- and {len(left) - 10} more (report.json `findings`)")
    for p in found:
        lines.append(f"- slow on the NPU: {p.get('title')} at {shown_where(p)}")
    return "\n".join(lines)
