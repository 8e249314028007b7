"""The bundle and report of a port (port.patch, patched tree, report.md, report.json, trace.jsonl), written for failed
ports too: it says what is left."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

from agents.deploy.serve_report import PENDING, serving_requested
from agents.models import FailureRecord
from agents.report.markdown import _md_escape, failure_markdown, render_markdown
from agents.request import request_of
from agents.state import (
    failure_of,
    goal_of,
    numerics_of,
    perf_of,
    reason_of,
    recorded,
    request_fields_of,
    runs_of,
    started_at_of,
    status_of,
    trace_of,
    workdir_if_set,
)
from agents.validation.coverage import coverage_reason
from agents.validation.perf_evidence import perf_markdown, shown_where, strict_failure, verdict
from agents.workspace import Workspace
from knowledge.bundles import MARKER as MARKER_NAME
from knowledge.bundles import mark_bundle


def final_status(state: dict[str, Any]) -> tuple[str, str]:
    if status_of(state) == "failed":
        return "failed", reason_of(state) or "failed"
    numerics = numerics_of(state)
    perf = perf_of(state)
    if numerics is not None and numerics.verdict == "match":
        if request_of(state).strict_perf and (why := strict_failure(perf)):
            return "failed", why
        reason = "the port runs on the target and its greedy tokens match the original"
        if numerics.compared == "outputs":  # a model without generate (an encoder)
            dtype = numerics.metrics.get("dtype") or "float32"
            reason = (f"the port runs on the target and its forward outputs match the original's within the {dtype} "
                      "tolerance (the model has no generate: it was validated on its outputs, not greedy tokens)")
        if partial := coverage_reason(numerics.coverage):
            reason += f"; {partial}"
        if found := perf.get("pathologies"):
            reason += "; decode profile: " + "; ".join(f"{p['title']} at {shown_where(p)}" for p in found)
        return "validated", reason
    return "failed", reason_of(state) or (numerics.detail if numerics else "") or \
        f"validation verdict {numerics.verdict if numerics else 'not-run'}"


TIMED_OUT = "timed out"
MODEL_FAILS = "the model fails by itself"
NOT_VALIDATED = "not validated"
NOT_PORTED = "not ported"


def outcome_label(state: dict[str, Any]) -> str:
    """How the CLI and the reports name a port that did not validate: a run stopped at its time limit is a
    timeout (with the limit and the flag that raises it in the reason), an original that fails the same way by
    itself is the model's own failure, a port that ran but whose reference could not is not validated; "not
    ported" only when the port itself failed."""
    reason = reason_of(state)
    numerics = numerics_of(state)
    verdict_now = numerics.verdict if numerics else None
    if verdict_now == "model-fails":
        return MODEL_FAILS
    if "was stopped at its time limit" in reason or (numerics is not None and "time limit" in numerics.detail):
        return TIMED_OUT
    port_ran = any(r.purpose == "port" and r.ok for r in runs_of(state))
    if port_ran and verdict_now in ("not-run", "nondeterministic-reference"):
        return NOT_VALIDATED
    return NOT_PORTED


def _left_as_written(hazard: str, finding_rule: str = "") -> str:
    """Why a finding can stay as written: its hazard rule's wording (the report names the message too); a
    finding that is information only (the rule's report_only_rules) says so in its own words."""
    from agents.rules.registry import active

    rule = active().get(hazard)
    if rule is not None and finding_rule in rule.report_only_rules and rule.manual.get(finding_rule):
        return rule.manual[finding_rule]
    return (rule.left_as_written if rule else "") or "no recipe changes it"


def _covering_edit(patch: dict[str, Any], finding: dict[str, Any]) -> str | None:
    """What the patch changed at the finding's line ("" when it does not say what), None when it rewrote
    other lines only; a patch that does not record its lines counts as covering its findings."""
    sites = patch.get("sites") or []
    if not sites:
        return ""
    edits = patch.get("edits") or []
    for i, site in enumerate(sites):
        file, _, span = site.rpartition(":")
        start, _, end = span.partition("-")
        if file == finding["file"] and start.isdigit() and end.isdigit() and int(start) <= finding["line"] <= int(end):
            edit = edits[i] if i < len(edits) and len(edits) == len(sites) else ""
            return edit.split(": ", 1)[1] if ": " in edit else ""
    return None


def _declined_reason(patches: list[dict[str, Any]], finding: dict[str, Any]) -> str:
    """Why a codemod left the finding's site as written ("file line N[-M]: why" covering its line)."""
    for p in patches:
        for d in p.get("declined") or []:
            m = re.match(r"(.+) line (\d+)(?:-(\d+))?: (.*)$", d, re.S)
            if m and m.group(1) == finding["file"] and \
                    int(m.group(2)) <= finding["line"] <= int(m.group(3) or m.group(2)):
                return m.group(4)
    return ""


def finding_resolutions(findings: list[dict[str, Any]], patches: list[dict[str, Any]], status: str) -> dict[str, str]:
    """finding id -> "fixed by patch-N (commit): what it changed", "NOT changed: ..." when the codemod planned
    for it left its site as written (a finding for the user, never a silent success), or "left as written: why"."""
    from agents.rules.registry import active

    planned: dict[str, dict[str, Any]] = {}
    for patch in patches:
        for fid in patch.get("finding_ids") or []:
            planned.setdefault(fid, patch)
    out: dict[str, str] = {}
    tail = "" if status == "validated" else " (the port did not validate)"
    for f in findings:
        p = planned.get(f["id"])
        if p is not None:
            what = _covering_edit(p, f)
            if what is not None:
                out[f["id"]] = f"fixed by {p['id']} ({p['commit'][:8]}, {p['codemod']})" + (f": {what}" if what else "")
                continue
            why = _declined_reason(patches, f) or "it does not recognise the code at this site"
            out[f["id"]] = (f"NOT changed: {p['codemod']} ({p['id']}) rewrote other sites but left this one as "
                            f"written: {why}{tail}")
            continue
        codemod = active().codemod_for(f["hazard"], f["rule"]) if f.get("fixable") else None
        if codemod:
            why = _declined_reason(patches, f) or "it does not recognise the code at this site"
            out[f["id"]] = f"NOT changed: the planned codemod {codemod} changed nothing here: {why}{tail}"
        else:
            out[f["id"]] = f"left as written: {_left_as_written(f['hazard'], f['rule'])}{tail}"
    return out


def _decode_profile_plot(report: dict[str, Any], out_dir: Path) -> str | None:
    """plots/profile/decode_profile.png (a subfolder: the benchmark section lists plots/*.png)."""
    if not (report.get("perf") or {}).get("rows"):
        return None
    from agents.deploy.plots import decode_profile

    folder = out_dir / "plots" / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    name = Path(request_of(report).model_path or "model").name
    path = decode_profile(report["perf"], folder / "decode_profile.png", name)
    return str(path.relative_to(out_dir)) if path else None


def _report_of(state: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    """report.json's fields from the state (agents/state.py ``recorded``: the state's records as JSON)."""
    fields = recorded(state)
    numerics = numerics_of(state)
    coverage = numerics.coverage if numerics else {}  # the module kinds the compared runs covered
    report = {"status": status, "reason": reason, "goal": goal_of(state),
              "wall_s": time.time() - (started_at_of(state) or time.time()),
              "verdict": verdict(status, perf_of(state), coverage), "coverage": coverage}
    for name in ("request", "plan", "target", "entry", "numerics", "tuning", "counters", "perf", "environment"):
        report[name] = fields[name] or {}
    for name in ("findings", "patches", "runs", "diagnoses"):
        report[name] = fields[name] or []
    report.update(original_digest=fields["original_digest"], workdir=fields["workdir"], failure=fields["failure"],
                  target=_target_record(state))
    return report


def write_bundle(state: dict[str, Any], out_dir: Path, status: str, reason: str) -> dict[str, Any]:
    workdir = workdir_if_set(state)
    mark_bundle(out_dir, str(workdir or ""))  # first: --force may later replace only this
    report = _report_of(state, status, reason)
    kinds = {r.get("isolation") or "process" for r in report["runs"]}
    report["isolation"] = "unisolated (process)" if "process" in kinds else ("bwrap" if kinds else "none (no run)")
    report["resolutions"] = finding_resolutions(report["findings"], report["patches"], status)
    files = _copy_traceback(failure_of(state), out_dir)
    if workdir and Workspace(workdir).has_repo():
        ws = Workspace(workdir)
        (out_dir / "port.patch").write_text(ws.diff_from_original())
        files["patch"] = str(out_dir / "port.patch")
        patched = out_dir / "patched"
        if patched.exists():
            shutil.rmtree(patched)
        ws.export_tree(patched)
        files["patched_tree"] = str(patched)
        if status == "validated":
            # run.py, serve.sh, set_env.sh, requirements/constraints and plots: only for a port that works.
            from agents.deploy import write_deploy_bundle

            files.update(write_deploy_bundle(state, out_dir))
            if files.get("deployment_json"):  # a model whose deployment does not apply (no generate)
                report["deployment"] = json.loads(Path(files["deployment_json"]).read_text())
    from agents.projection.projector import report_projection  # "Projected on <chip>" (issue 44)

    report["projection"] = report_projection(state, out_dir / "patched" if (out_dir / "patched").is_dir() else None,
                                             (report.get("deployment") or {}).get("implementation"),
                                             meta=status == "validated")
    llm_dir = workdir / "llm" if workdir else None
    if workdir and llm_dir is not None and llm_dir.is_dir():  # every prompt and response of the LLM agents, scrubbed
        if (out_dir / "llm").exists():
            shutil.rmtree(out_dir / "llm")
        shutil.copytree(llm_dir, out_dir / "llm")
        files["llm"] = str(out_dir / "llm")
        usage_file = workdir / "llm_usage.json"
        usage = json.loads(usage_file.read_text()) if usage_file.is_file() else {}
        # What each agent did with the LLM, or why the rules decided instead (a timeout, a spent budget).
        notes = [f"{t['agent']}: {t['summary']}" for t in trace_of(state) if (t.get("detail") or {}).get("llm")]
        report["llm"] = {"exchanges": len(list(llm_dir.glob("*.json"))), "tokens": usage.get("tokens"),
                         "limit": usage.get("limit"), "records": "llm/", "decisions": notes}
    plot = _decode_profile_plot(report, out_dir)
    if plot:
        files["plot_decode_profile"] = str(out_dir / plot)
    if status == "validated" and serving_requested(state) and not report.get("deployment"):
        report["deployment"] = {"status": PENDING}  # the deployment phase follows (agents/report/deployment.py)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    _write_report_and_trace(out_dir, bundle_markdown(report, out_dir), trace_of(state), files)
    return {"dir": str(out_dir), "files": files}


def bundle_markdown(report: dict[str, Any], out_dir: Path) -> str:
    """report.md from report.json and the bundle's files alone, so the deployment phase (or `npuport deploy`)
    renders it again once deployment.json is in."""
    plot_file = out_dir / "plots" / "profile" / "decode_profile.png"
    plot = str(plot_file.relative_to(out_dir)) if plot_file.is_file() else None
    profiled = (report["perf"] or {}).get("profiled")  # only measured sections: no profile, no section
    markdown = render_markdown(report) + ("\n".join(perf_markdown(report["perf"], report["status"], plot))
                                          if profiled else "")
    if report.get("llm"):
        llm = report["llm"]
        markdown += (f"\n\n## LLM\n\n{llm['exchanges']} exchange(s), {llm['tokens']} of {llm['limit']} tokens; "
                     "every prompt and response (secrets scrubbed) is in `llm/`, and each LLM fix's commit names "
                     "its prompt.\n")
        markdown += "".join(f"\n- {_md_escape(n)}" for n in llm.get("decisions") or []) + "\n"
    if report["status"] == "validated":
        from agents.deploy import deploy_markdown

        markdown += "\n" + deploy_markdown(report, out_dir)
    return markdown


def _write_report_and_trace(out_dir: Path, markdown: str, trace: list[Any], files: dict[str, str]) -> None:
    """report.md and trace.jsonl, listed in ``files`` with report.json (written before)."""
    (out_dir / "report.md").write_text(markdown)
    with (out_dir / "trace.jsonl").open("w") as fh:
        for item in trace:
            fh.write(json.dumps(item, default=str) + "\n")
    files.update({"report_md": str(out_dir / "report.md"), "report_json": str(out_dir / "report.json"),
                  "trace": str(out_dir / "trace.jsonl")})


def _copy_traceback(failure: FailureRecord | None, out_dir: Path) -> dict[str, str]:
    """A crashed node's traceback file (graph/guard.py), copied into the bundle beside the report."""
    src = Path(failure.traceback) if failure and failure.traceback else None
    if src is None or not src.is_file():
        return {}
    dest = out_dir / "failure-traceback.txt"
    shutil.copyfile(src, dest)
    return {"failure_traceback": str(dest)}


def emergency_report(state: dict[str, Any], failure: dict[str, Any]) -> dict[str, Any]:
    """The reporter itself raised: write report.json, report.md and trace.jsonl from the state alone
    (no diff, no patched tree: the workspace may be what broke), so the run still ends with a report
    naming the failure. Called by the reporter's guard (graph/guard.py)."""
    reason = f"the {failure['node']} step failed: {failure['error']}: {failure['message']}"
    out_dir = default_out_dir(state)
    try:
        mark_bundle(out_dir)
    except OSError:
        workdir = workdir_if_set(state)
        out_dir = workdir / "bundle" if workdir else Path.cwd() / "npuport-report"
        mark_bundle(out_dir)
    # the state's records as they are, unread (agents/state.py ``recorded``): one that no longer validates
    # may be what broke the reporter
    fields = recorded(state)
    report = {"status": "failed", "reason": reason, "goal": goal_of(state),
              "wall_s": time.time() - (started_at_of(state) or time.time()), "failure": failure,
              **{name: fields[name] or {} for name in ("request", "target", "numerics", "tuning", "counters")},
              **{name: fields[name] or [] for name in ("findings", "patches", "runs", "diagnoses")},
              "target": _target_record(state)}
    report["resolutions"] = {}
    files = _copy_traceback(FailureRecord.model_validate(failure), out_dir)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    try:
        markdown = render_markdown(report)
    except Exception:  # the state itself may be what broke rendering: say the essentials
        model = Path(str(request_fields_of(state).get("model_path") or "?")).name
        markdown = "\n".join([f"# npuport report: {model}", "",
                              f"- **Status:** failed (partial bundle) — {reason}", *failure_markdown(failure), ""])
    _write_report_and_trace(out_dir, markdown, trace_of(state), files)
    return {"bundle": {"dir": str(out_dir), "files": files, "note": "emergency report: the reporter failed"}}


def default_out_dir(state: dict[str, Any]) -> Path:
    """The request's out_dir; without one (LangGraph Studio, a bare graph run) a folder under the home,
    ``$NPUPORT_HOME/jobs/<workspace>/bundle``: never the working directory, which a server's file
    watcher may reload the graph from (the reply and the state say where the bundle went)."""
    req = request_of(state)
    if req.out_dir:
        return Path(req.out_dir).expanduser()
    return home_bundle_dir(state)


def home_bundle_dir(state: dict[str, Any]) -> Path:
    from knowledge.home import npuport_home

    model = Path(request_of(state).model_path or "model").name
    workdir = workdir_if_set(state)
    key = workdir.name if workdir else f"{model}-{int(time.time())}"
    return npuport_home() / "jobs" / key / "bundle"


def bundle_conflict(out_dir: Path, state: dict[str, Any]) -> str | None:
    """Why this port may not write its bundle into ``out_dir``: a folder of a user's files, or another
    port's bundle (only --force, which empties it first, replaces one). None: empty, missing, or ours."""
    from knowledge.bundles import bundle_dir_problem, bundle_owner

    if problem := bundle_dir_problem(out_dir):
        return problem
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return None
    owner = bundle_owner(out_dir)
    if owner == str(workdir_if_set(state) or "") or (owner == "" and (out_dir / MARKER_NAME).is_file()):
        return None  # this port's own bundle (a resume), or a folder marked for npuport with no owner yet
    return f"{out_dir} holds another port's bundle; it is not overwritten without --force"


def _target_record(state: dict[str, Any]) -> dict[str, Any]:
    """The resolved target; before the environment agent ran, the name the input gave (Studio's form sends one)."""
    target = recorded(state)["target"]
    return target if isinstance(target, dict) else {"name": str(target)} if target else {}
