"""reporter: writes the bundle (port.patch, patched tree, report.md, report.json, trace.jsonl)
and decides the final status. A bundle is written for failed ports too: it says what is left."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from agents.perf_evidence import perf_markdown, strict_failure, verdict
from agents.trace import step
from agents.workspace import Workspace


def final_status(state: dict[str, Any]) -> tuple[str, str]:
    if state.get("status") == "failed":
        return "failed", state.get("reason") or "failed"
    numerics = state.get("numerics") or {}
    if numerics.get("verdict") == "match":
        if (state.get("request") or {}).get("strict_perf") and (why := strict_failure(state.get("perf"))):
            return "failed", why
        reason = "the port runs on the target and its greedy tokens match the original"
        if found := (state.get("perf") or {}).get("pathologies"):
            reason += "; decode profile: " + "; ".join(f"{p['title']} at {p.get('where') or '?'}" for p in found)
        return "validated", reason
    return "failed", state.get("reason") or numerics.get("detail") or f"validation verdict {numerics.get('verdict', 'not-run')}"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# Why a finding can stay as written, by hazard (the report names the finding's own message too).
_LEFT_AS_WRITTEN = {
    "H3": "the CUDA-only path stays off (its import is guarded or gone); the torch path runs",
    "H4": "a performance opportunity; not needed for a correct port",
    "H5": "only an issue on chips without the dtype (bfloat16 on 310P) or for exact float64 numerics",
    "H6": "a performance issue (host syncs / Python loops); the port is correct with it",
    "H7": "falls back to the CPU on this torch_npu build; correct but slow",
    "H8": "the model runs in a layered environment with its own pins",
    "H10": "serving settings are written into serve.sh / set_env.sh",
    "H11": "the device fix puts both sides on the port's device; validated by the run",
}


def finding_resolutions(findings: list[dict[str, Any]], patches: list[dict[str, Any]], status: str) -> dict[str, str]:
    """finding id -> "fixed by patch-N (commit)" or "left as written: why"."""
    fixed: dict[str, str] = {}
    for p in patches:
        for fid in p.get("finding_ids") or []:
            fixed.setdefault(fid, f"fixed by {p['id']} ({p['commit'][:8]}, {p['codemod']})")
    out: dict[str, str] = {}
    for f in findings:
        if f["id"] in fixed:
            out[f["id"]] = fixed[f["id"]]
        else:
            why = _LEFT_AS_WRITTEN.get(f["hazard"], "no recipe changes it")
            out[f["id"]] = f"left as written: {why}" + ("" if status == "validated" else " (the port did not validate)")
    return out


def _isolation_text(runs: list[dict[str, Any]]) -> str:
    kinds = sorted({r.get("isolation") or "process" for r in runs}) or ["none (no run)"]
    text = ", ".join(kinds)
    if "process" in kinds:
        text += (" (own process group, rlimits, wall timeout, scrubbed environment; without bubblewrap the model's "
                 "code can still read the host's files and reach the network)")
    return text


def _fallback_text(op: str, info: Any) -> str:
    return f"{op} x{info.get('count', '?')}" if isinstance(info, dict) else op


def render_markdown(report: dict[str, Any]) -> str:
    req = report["request"]
    lines = [
        f"# npuport report: {Path(req.get('model_path', '?')).name}",
        "",
        f"- **Status:** {report.get('verdict') or report['status']} — {report['reason']}",
        f"- **Target:** {report.get('target', {}).get('name', '?')} ({report.get('target', {}).get('reason', '')})",
        f"- **Chip / torch_npu:** {req.get('chip')} / {req.get('torch_npu')}",
        f"- **Sandbox runs:** {report['counters'].get('port_runs', 0)} of the port, "
        f"{report['counters'].get('reference_runs', 0)} of the original (reference)",
        f"- **Wall time:** {report['wall_s']:.1f} s",
        f"- **Sandbox isolation:** {_isolation_text(report['runs'])}",
        "",
        "## Findings",
        "",
    ]
    if report["findings"]:
        res = report.get("resolutions") or {}
        lines += ["| hazard | where | category | severity | what | resolution |", "|---|---|---|---|---|---|"]
        for f in report["findings"]:
            lines.append(f"| {f['hazard']} | {f['file']}:{f['line']} | {f['category']} | {f['severity']} | "
                         f"{_md_escape(f['message'])} | {_md_escape(res.get(f['id'], ''))} |")
    else:
        lines.append("No hazards found.")
    lines += ["", "## Patches (one commit each; `port.patch` is the whole diff)", ""]
    for p in report["patches"]:
        lines.append(f"- `{p['commit'][:8]}` {p['summary']} — files: {', '.join(p['files'])}; cites: "
                     f"{', '.join(c['source'] for c in p['citations']) or '-'}")
    if not report["patches"]:
        lines.append("No patches.")
    lines += ["", "## Sandbox runs", "", "| run | purpose | target | status | wall s | tokens | error |", "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        exc = r.get("exception") or {}
        err = f"{exc.get('type')}: {exc.get('message', '')[:120]}" if exc else ""
        lines.append(f"| {r['id']} | {r['purpose']} | {r['target']} | {r['status']} | {r['wall_s']:.2f} | "
                     f"{r.get('tokens')} | {_md_escape(err)} |")
    lines += ["", "## Diagnoses", ""]
    for d in report["diagnoses"]:
        lines.append(f"- {d['id']} `{d['signature']}`: {d['summary']} — fix: {d.get('fix') or 'none'}")
    if not report["diagnoses"]:
        lines.append("None: no run failed.")
    n = report.get("numerics") or {}
    lines += ["", "## Validation", "", f"- verdict: **{n.get('verdict', 'not-run')}** — {n.get('detail', '')}",
              f"- reference tokens (original, CPU float32 via device redirect): {n.get('reference_tokens')}",
              f"- port tokens (on the target): {n.get('port_tokens')}"]
    op = next((r.get("op_stats") for r in reversed(report["runs"]) if r["purpose"] == "port" and r.get("op_stats")), None)
    if op:
        fallbacks = ", ".join(_fallback_text(k, v) for k, v in (op.get("fallbacks") or {}).items()) or "none"
        lines += ["", "## Op inventory (last port run)", "", f"- CPU fallbacks: {fallbacks}",
                  f"- host syncs: {(op.get('host_syncs') or {}).get('total')}"]
    t = report.get("tuning") or {}
    lines += ["", "## Tuning", "", f"- status: {t.get('status', 'skipped')} — {t.get('detail', '')}",
              f"- trials: {len(t.get('trials') or [])}; best: {t.get('best') or '-'}", ""]
    cites = sorted({c for p in report["patches"] for c in (x["source"] for x in p["citations"])}
                   | {c["source"] for f in report["findings"] for c in f.get("citations", [])}
                   | {c["source"] for d in report["diagnoses"] for c in d.get("citations", [])})
    lines += ["## Citations", ""] + [f"- {c}" for c in cites] + [""]
    return "\n".join(lines)


def _decode_profile_plot(report: dict[str, Any], out_dir: Path) -> str | None:
    """plots/profile/decode_profile.png (a subfolder: the benchmark section lists plots/*.png)."""
    if not (report.get("perf") or {}).get("rows"):
        return None
    from agents.deploy.plots import decode_profile

    folder = out_dir / "plots" / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    name = Path((report.get("request") or {}).get("model_path") or "model").name
    path = decode_profile(report["perf"], folder / "decode_profile.png", name)
    return str(path.relative_to(out_dir)) if path else None


def write_bundle(state: dict[str, Any], out_dir: Path, status: str, reason: str) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "status": status, "reason": reason, "request": state.get("request") or {}, "goal": state.get("goal", ""),
        "plan": state.get("plan") or {}, "target": state.get("target") or {}, "entry": state.get("entry") or {},
        "findings": state.get("findings") or [], "patches": state.get("patches") or [], "runs": state.get("runs") or [],
        "diagnoses": state.get("diagnoses") or [], "numerics": state.get("numerics") or {},
        "tuning": state.get("tuning") or {}, "counters": state.get("counters") or {},
        "perf": state.get("perf") or {}, "verdict": verdict(status, state.get("perf")),
        "original_digest": state.get("original_digest"), "workdir": state.get("workdir"),
        "wall_s": time.time() - (state.get("started_at") or time.time()),
    }
    report["resolutions"] = finding_resolutions(report["findings"], report["patches"], status)
    files = {}
    if state.get("workdir") and (Path(state["workdir"]) / "model" / ".git").exists():
        ws = Workspace(Path(state["workdir"]))
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
    plot = _decode_profile_plot(report, out_dir)
    if plot:
        files["plot_decode_profile"] = str(out_dir / plot)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    markdown = render_markdown(report) + "\n".join(perf_markdown(report["perf"], status, plot))
    if status == "validated":
        from agents.deploy import deploy_markdown

        markdown += "\n" + deploy_markdown(state, out_dir)
    (out_dir / "report.md").write_text(markdown)
    with (out_dir / "trace.jsonl").open("w") as fh:
        for item in state.get("trace") or []:
            fh.write(json.dumps(item, default=str) + "\n")
    files.update({"report_md": str(out_dir / "report.md"), "report_json": str(out_dir / "report.json"),
                  "trace": str(out_dir / "trace.jsonl")})
    return {"dir": str(out_dir), "files": files}


def default_out_dir(state: dict[str, Any]) -> Path:
    req = state.get("request") or {}
    if req.get("out_dir"):
        return Path(req["out_dir"]).expanduser()
    name = Path(req.get("model_path") or "model").name
    return Path.cwd() / "npuport-out" / name


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
