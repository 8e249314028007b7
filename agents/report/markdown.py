"""report.md: what a person reads first, in one screen: a summary (verdict, what changed, what is left,
where it would be slow on the NPU and why), then one short section per thing that was measured, with
the model's own blockers first. The full detail (every token id, every edit, every trial) stays in
report.json; each section here is one function, and a section with nothing measured is left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.fixing.helper_module import HELPER_FILE
from agents.projection.render import report_section  # "Projected on <chip>" (issue 44)
from agents.report.coverage_section import coverage_markdown
from agents.request import request_of
from agents.runs import token_summary
from agents.state import target_name_of
from sandbox.targets import CHIP_REGISTRY

MAX_FINDING_ROWS = 15
MAX_EDITS_PER_PATCH = 3
_CATEGORY_ORDER = {"blocks running": 0, "changes numbers": 1, "slows down": 2}
_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}
_LEFT = ("NOT changed", "left as written")


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")



def _isolation_text(runs: list[dict[str, Any]]) -> str:
    kinds = sorted({r.get("isolation") or "process" for r in runs}) or ["none (no run)"]
    text = ", ".join(kinds)
    if "process" in kinds:
        text += (" — UNISOLATED (own process group, rlimits, wall timeout, scrubbed environment; without bubblewrap "
                 "the model's code can still read and write the host's files and reach the network)")
    return text


def _environment_text(env: dict[str, Any]) -> str:
    res = env.get("resolution") or {}
    where = f"layered venv `{env['python']}`" if env.get("python") else "npuport's own interpreter (no layer needed)"
    from agents.environment.release_choice import choice_text

    chosen = choice_text(res)  # the release the code's reads chose over config.json's, and why
    return f"{res.get('summary') or 'not resolved'}; ran in {where}" + (f"; {chosen}" if chosen else "")


def _fallback_text(op: str, info: Any) -> str:
    return f"{op} x{info.get('count', '?')}" if isinstance(info, dict) else op


def _chip_text(key: Any) -> str:
    """The chip with its product line, from the chip registry (sandbox/targets/chips.py)."""
    chip = CHIP_REGISTRY.get(str(key))
    return f"{key} ({chip.product})" if chip else str(key)



def failure_markdown(failure: dict[str, Any] | None) -> list[str]:
    """The report's "what failed and where" section, for a run that a node's exception ended."""
    if not failure:
        return []
    kind = "an npuport error" if failure.get("expected") else "an unexpected error (a bug in npuport or the host)"
    return ["", "## Failure", "",
            f"- **Failed step:** `{failure.get('node')}` — {kind}",
            f"- **Error:** `{failure.get('error')}`: {_md_escape(str(failure.get('message') or ''))}",
            f"- **Traceback:** {failure.get('traceback') or 'not saved'} (copied to failure-traceback.txt)",
            "- This bundle is partial: it holds what the steps before the failure computed."]




def _is_secondary_file(rel: str) -> bool:
    """Tests, examples and scripts beside the model: their findings come after the model's own."""
    parts = rel.split("/")
    name = parts[-1]
    return (any(p in ("tests", "test", "scripts", "examples", "tools", "benchmarks") for p in parts[:-1])
            or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
            or not name.endswith(".py"))


def _finding_rank(f: dict[str, Any], entry_file: str) -> tuple[Any, ...]:
    """The model's blockers first: the entry's module, then its other files, then tests and scripts;
    within each, what blocks running before what changes numbers before what slows down."""
    where = 0 if f["file"] == entry_file else 2 if _is_secondary_file(f["file"]) else 1
    return (where, _CATEGORY_ORDER.get(f["category"], 3), _SEVERITY_ORDER.get(f["severity"], 3), f["file"], f["line"])


def _entry_file(report: dict[str, Any]) -> str:
    cls = ((report.get("entry") or {}).get("entry") or {}).get("class") or ""
    module = cls.partition(":")[0]
    return module.replace(".", "/") + ".py" if module else ""


def ordered_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    entry = _entry_file(report)
    return sorted(report.get("findings") or [], key=lambda f: _finding_rank(f, entry))


def user_site(where: str | None, report: dict[str, Any]) -> str:
    """A file:line as the user can open it: in their folder, or in the bundle's patched/ tree (the port's
    line numbers), or said to lie outside the model's files (a library's code)."""
    if not where:
        return "?"
    file, sep, line = str(where).rpartition(":")
    if not sep or not line.isdigit():
        return str(where)
    roots = [(Path(request_of(report).model_path or ""), ""),
             (Path(report.get("workdir") or "") / "model", " (in patched/)")]
    rel = file
    for root, _ in roots:
        if root.parts and Path(file).is_absolute() and Path(file).is_relative_to(root):
            rel = Path(file).relative_to(root).as_posix()
    for root, tag in roots:
        path = root / rel
        if root.parts and not Path(rel).is_absolute() and path.is_file():
            try:
                n_lines = len(path.read_bytes().splitlines())
            except OSError:
                continue
            if int(line) <= n_lines:
                return f"{rel}:{line}{tag}"
    return f"{where} (outside the model's files)"


def _summary(report: dict[str, Any]) -> list[str]:
    req = request_of(report)
    res = report.get("resolutions") or {}
    patches = report.get("patches") or []
    files = sorted({f for p in patches for f in p.get("files") or []})
    left = [f for f in report.get("findings") or [] if str(res.get(f["id"], "")).startswith(_LEFT)]
    blockers = [f for f in left if f["category"] != "slows down"]
    files = [f for f in files if not f.endswith(HELPER_FILE)] + [f for f in files if f.endswith(HELPER_FILE)]
    lines = [f"# npuport report: {Path(req.model_path or '?').name}", "",
             f"**{report.get('verdict') or report['status']}**{' (partial bundle)' if report.get('failure') else ''}"
             f" — {_md_escape(str(report['reason']))}", "",
             "- **Changed:** " + (f"{len(patches)} patch(es) in {', '.join(files[:6])}"
                                  f"{f' and {len(files) - 6} more' if len(files) > 6 else ''} (`port.patch`)"
                                  if patches else "nothing")]
    quant = (report.get("entry") or {}).get("quantized")
    if quant:  # a quantized release: what the validation covers (agents/reading/quant_path.py)
        lines.append(f"- **Quantized checkpoint:** validated {_md_escape(str(quant.get('validated')))}; "
                     f"{_md_escape(str(quant.get('ascend')))}")
    if left:
        lines.append(f"- **Left:** {len(left)} finding(s) not changed ({len(blockers)} that block running or "
                     "change numbers); see Findings")
    else:
        lines.append("- **Left:** nothing: every finding was fixed" if report.get("findings")
                     else "- **Left:** nothing found")
    lines.append(f"- **Slow on the NPU:** {_slow_text(report)}")
    tuning = report.get("tuning") or {}
    if tuning.get("status") not in (None, "skipped"):
        lines.append(f"- **Throughput:** {_md_escape(str(tuning.get('detail') or tuning.get('status')))}")
    if report.get("status") == "validated":
        lines.append(f"- **Deployment:** {_md_escape(_deployment_text(report))}")
    counters = report.get("counters") or {}
    lines += [f"- **Target:** {target_name_of(report) or '?'}, chip {_chip_text(req.chip)}, torch_npu "
              f"{req.torch_npu}; {counters.get('port_runs', 0)} port + {counters.get('reference_runs', 0)} "
              f"reference run(s) in {report['wall_s']:.0f} s; isolation {_isolation_text(report.get('runs') or [])}",
              f"- **Environment (every run):** {_md_escape(_environment_text(report.get('environment') or {}))}",
              *([f"- **Reference adjusted:** {len(adj)} switch-only edit(s) to the reference copy, without which the "
                 "original cannot be built on a host without CUDA; see Validation"]
                 if (adj := reference_adjustments(report))
                else []),
              "- Every detail (token ids, each edit, each trial) is in `report.json`.", ""]
    return lines


def _deployment_text(report: dict[str, Any]) -> str:
    """The deployment in one line (agents/report/deployment.py), or why it did not run."""
    from agents.deploy.serve_report import deployment_summary, serving_requested

    record = report.get("deployment")
    if record:
        return deployment_summary(record) + ("; see Deployment" if record.get("status") != "pending" else "")
    return ("not exercised: serving was off (`npuport deploy BUNDLE` runs it)" if not serving_requested(report)
            else "not exercised")


def _slow_text(report: dict[str, Any]) -> str:
    perf = report.get("perf") or {}
    found = perf.get("pathologies") or []
    parts = [f"{p['title']} at {p.get('user_where') or user_site(p.get('where'), report)}"
             + (f" ({p['cause']})" if p.get("cause") else "")
             for p in found]
    op = _last_op_stats(report)
    if op and op.get("fallbacks"):
        parts.append("CPU fallbacks: " + ", ".join(_fallback_text(k, v) for k, v in op["fallbacks"].items()))
    if parts:
        return _md_escape("; ".join(parts))
    return "nothing found in the decode profile" if perf.get("profiled") else "not profiled"


def _last_op_stats(report: dict[str, Any]) -> dict[str, Any] | None:
    return next((r.get("op_stats") for r in reversed(report.get("runs") or [])
                 if r.get("purpose") == "port" and r.get("op_stats")), None)


def _findings(report: dict[str, Any]) -> list[str]:
    findings = ordered_findings(report)
    if not findings:
        return ["## Findings", "", "No hazards found.", ""]
    res = report.get("resolutions") or {}
    lines = ["## Findings (the model's blockers first)", "", "| hazard | where | what | resolution |",
             "|---|---|---|---|"]
    for f in findings[:MAX_FINDING_ROWS]:
        site = user_site(f"{f['file']}:{f['line']}", report)
        lines.append(f"| {f['hazard']} {f['category']}, {f['severity']} | {site} | "
                     f"{_md_escape(f['message'])} | {_md_escape(res.get(f['id'], ''))} |")
    if len(findings) > MAX_FINDING_ROWS:
        lines.append(f"\n{len(findings) - MAX_FINDING_ROWS} more finding(s) in `report.json` (`findings`).")
    return lines + [""]


def _how_run(report: dict[str, Any]) -> list[str]:
    assumptions = (report.get("entry") or {}).get("assumptions") or []
    # the inputs of the last run that had them: a debugger's inputs fix (hazard H26) changes them between runs
    inputs: dict[str, Any] = next((r["inputs"] for r in reversed(report.get("runs") or []) if r.get("inputs")), {})
    offline: list[str] = next((r["built_offline"] for r in report.get("runs") or [] if r.get("built_offline")), [])
    if not (assumptions or inputs or offline):
        return []
    return (["## How the model was run (entry, inputs)", ""] + [f"- {_md_escape(a)}" for a in assumptions]
            + [f"- inputs ({inputs.get('source')}): {_md_escape(n)}" for n in inputs.get("notes") or []]
            + [f"- built offline: {_md_escape(n)}" for n in offline] + [""])


def _shrunk(report: dict[str, Any]) -> list[str]:
    shrunk = next((r["shrunk"] for r in report.get("runs") or [] if r.get("shrunk") is not None), None)
    if shrunk is None:
        return []
    return (["## Shrunk config (--shrink: random weights, fixed seed; every run used it)", ""]
            + ([f"- `{c}`" for c in shrunk] or ["- nothing: no size in config.json matched a shrink rule"]) + [""])


def _patches(report: dict[str, Any]) -> list[str]:
    patches = report.get("patches") or []
    if not patches:
        return []
    lines = ["## Patches (one commit each; `port.patch` is the whole diff)", ""]
    for p in patches:
        lines.append(f"- `{p['commit'][:8]}` {p['summary']} — cites: "
                     f"{', '.join(c['source'] for c in p.get('citations') or []) or '-'}")
        edits, declined = p.get("edits") or [], p.get("declined") or []
        lines += [f"  - changed {e}" for e in edits[:MAX_EDITS_PER_PATCH]]
        lines += [f"  - NOT changed {d}" for d in declined[:MAX_EDITS_PER_PATCH]]
        more = max(len(edits) - MAX_EDITS_PER_PATCH, 0) + max(len(declined) - MAX_EDITS_PER_PATCH, 0)
        if more:
            lines.append(f"  - and {more} more site(s) (report.json)")
    return lines + [""]


def _runs(report: dict[str, Any]) -> list[str]:
    runs = report.get("runs") or []
    if not runs:
        return []
    lines = ["## Sandbox runs", "", "| run | purpose | target | status | wall s | tokens | error |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        exc = r.get("exception") or {}
        err = f"{exc.get('type')}: {exc.get('message', '')[:120]}" if exc else ""
        lines.append(f"| {r['id']} | {r['purpose']} | {r['target']} | {r['status']} | {r['wall_s']:.2f} | "
                     f"{token_summary(r.get('tokens'))} | {_md_escape(err)} |")
    return lines + [""]


def _diagnoses(report: dict[str, Any]) -> list[str]:
    diagnoses = report.get("diagnoses") or []
    if not diagnoses:
        return []
    from agents.sites import port_site

    def where(d: dict[str, Any]) -> str:  # the traceback's line is one of the patched tree: the user's line
        if not d.get("file") or not d.get("line"):
            return ""
        site = port_site(f"{d['file']}:{d['line']}", report.get("workdir"), request_of(report).model_path)
        return f" at {site}"

    return ["## Diagnoses", ""] + [f"- {d['id']} `{d['signature']}`{where(d)}: {d['summary']} — fix: "
                                   f"{d.get('fix') or 'none'}" for d in diagnoses] + [""]


def reference_adjustments(report: dict[str, Any]) -> list[str]:
    """The switch-only edits the reference copy needed to be built on this host (agents/validation/reference.py)."""
    return next((r["reference_adjusted"] for r in report.get("runs") or []
                 if r.get("purpose") == "reference" and r.get("reference_adjusted")), [])


def _validation(report: dict[str, Any]) -> list[str]:
    n = report.get("numerics") or {}
    if not n:
        return []
    lines = ["## Validation", "",
             f"- verdict: **{n.get('verdict', 'not-run')}** — {_md_escape(str(n.get('detail', '')))}"]
    if n.get("compared") == "outputs":
        metrics = n.get("metrics") or {}
        tol = metrics.get("tolerance") or {}
        lines.append(f"- compared: the forward outputs (the model has no generate), each tensor against the original's "
                     f"(CPU float32 via device redirect) within the {metrics.get('dtype', 'float32')} tolerance: "
                     f"cosine >= {tol.get('min_cosine')}, at most {float(tol.get('max_share_over_1e3') or 0):.0%} of "
                     "elements off by more than 1e-3 relative (per tensor: report.json `numerics.metrics.outputs`)")
    else:  # the runs' own tokens when the comparison did not get as far as holding them (a reference that failed)
        ref = n.get("reference_tokens") or _last_tokens(report, "reference")
        port = n.get("port_tokens") or _last_tokens(report, "port")
        lines += ["- reference tokens (original, CPU float32 via device redirect): "
                  f"{_tokens_or_why(ref, report, 'reference')}",
                  f"- port tokens (on the target): {_tokens_or_why(port, report, 'port')} (every id: report.json "
                  "`numerics` and `runs`)"]
    lines += [f"- {_md_escape(a)}" for a in reference_adjustments(report)]
    return lines + [""]


def _last_tokens(report: dict[str, Any], purpose: str) -> list[list[int]] | None:
    return next((r["tokens"] for r in reversed(report.get("runs") or [])
                 if r.get("purpose") == purpose and r.get("tokens") is not None), None)


def _tokens_or_why(tokens: list[list[int]] | None, report: dict[str, Any], purpose: str) -> str:
    """The tokens, or why a run of that purpose has none (never a bare None)."""
    if tokens is not None:
        return token_summary(tokens)
    last = next((r for r in reversed(report.get("runs") or []) if r.get("purpose") == purpose), None)
    if last is None:
        return "none (no such run)"
    return f"none (run {last['id']} ended {last.get('status')} after {float(last.get('wall_s') or 0):.0f} s)"


def _op_inventory(report: dict[str, Any]) -> list[str]:
    op = _last_op_stats(report)
    if not op:
        return []
    fallbacks = ", ".join(_fallback_text(k, v) for k, v in (op.get("fallbacks") or {}).items()) or "none"
    return ["## Op inventory (last port run)", "", f"- CPU fallbacks: {fallbacks}",
            f"- host syncs: {(op.get('host_syncs') or {}).get('total')}", ""]


def _tuning(report: dict[str, Any]) -> list[str]:
    t = report.get("tuning") or {}
    if t.get("status") in (None, "skipped"):
        return []
    best = " ".join(f"{k}={v}" for k, v in (t.get("best") or {}).items() if v is not None) or "-"
    lines = ["## Tuning", "", f"- status: {t.get('status')} — {_md_escape(str(t.get('detail', '')))}",
             f"- trials: {len(t.get('trials') or [])}; deployed: {best}"]
    how = (t.get("tuned") or {}).get("measured_as")
    if how:
        lines.append(f"- measured: {how}")
    lines += [f"- not a tuning result: {kv} {_md_escape(why)}" for kv, why in (t.get("unsupported") or {}).items()]
    return lines + [""]


def _citations(report: dict[str, Any]) -> list[str]:
    cites = sorted({c for p in report.get("patches") or [] for c in (x["source"] for x in p.get("citations") or [])}
                   | {c["source"] for f in report.get("findings") or [] for c in f.get("citations", [])}
                   | {c["source"] for d in report.get("diagnoses") or [] for c in d.get("citations", [])})
    return ["## Citations", ""] + [f"- {c}" for c in cites] + [""] if cites else []


SECTIONS = (_summary, _findings, _patches, _validation, coverage_markdown, _tuning, report_section, _op_inventory,
            _diagnoses, _how_run, _shrunk, _runs, _citations)


def render_markdown(report: dict[str, Any]) -> str:
    """report.md without the decode profile, LLM and deployment sections (write_bundle appends those)."""
    lines: list[str] = []
    for section in SECTIONS:
        lines += section(report)
        if section is _summary:
            lines += failure_markdown(report.get("failure"))
    return "\n".join(lines)
