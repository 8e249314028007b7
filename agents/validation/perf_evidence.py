"""Performance pathologies of a validated generative port, found in the decode profile that the harness
measured in the same runs (sandbox/harness/profile.py): pure functions over the profile dicts, no model runs.

Matching tokens say a port is correct, not that it decodes the way it should. Each rule below reads
the per-step numbers and names the code line the profiler recorded:

- ``no-kv-cache``: decode steps take more than one new position (the whole sequence is run again),
- ``submodule-every-step``: a submodule runs in every step with the same input shapes in the prefill
  and the decode steps (an encoder that should run once),
- ``step-loop-syncs`` / ``step-loop-fallbacks``: host syncs or CPU fallbacks in most decode steps,
- ``whole-output-decode``: the loop decodes the whole output every step (a tokenizer ``decode`` whose
  input grows with the position, or loop time outside the step that grows with it).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

Kind = Literal["no-kv-cache", "submodule-every-step", "step-loop-syncs", "step-loop-fallbacks", "whole-output-decode"]
MIN_STEPS = 3  # a prefill and two decode steps: fewer cannot show a trend
RECIPES = Path(__file__).resolve().parents[2] / "knowledge" / "recipes"


class PerfFinding(BaseModel):
    kind: Kind
    title: str
    where: str | None = None
    """'file:line' in the model, from the profiler's stack (a line of the patched tree)."""
    user_where: str | None = None
    """``where`` in the user's own file (agents/sites.py), set by the validator from the workspace."""
    evidence: str
    numbers: dict[str, Any] = Field(default_factory=dict)
    cause: str = ""
    fix: str | None = None
    """A recipe of knowledge/recipes that fixes it, when one exists ("H6: ...")."""
    module: str | None = None
    in_original: bool | None = None
    """Also in the original (inherited) or introduced by the port; None without a reference profile."""


def _recipe(hid: str) -> str | None:
    path = RECIPES / f"{hid}.md"
    if not path.exists():
        return None
    title = next((ln.split(":", 1)[1].strip() for ln in path.read_text().splitlines() if ln.startswith("title:")), "")
    return f"{hid}: {title} (knowledge/recipes/{hid}.md)"


def _decode_steps(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return list((profile.get("steps") or [])[1:])


def _loop_count(step: dict[str, Any], key: str) -> int:
    """Syncs or fallbacks of one step: inside it and in the loop body after it."""
    return int(step.get(key) or 0) + int((step.get("gap") or {}).get(key) or 0)


def _loop_sites(steps: list[dict[str, Any]], key: str) -> dict[str, int]:
    sites: dict[str, int] = {}
    for s in steps:
        for part in (s, s.get("gap") or {}):
            for site, n in (part.get(key) or {}).items():
                sites[site] = sites.get(site, 0) + int(n)
    return dict(sorted(sites.items(), key=lambda kv: -kv[1]))


def _no_kv_cache(profile: dict[str, Any]) -> PerfFinding | None:
    steps = profile["steps"]
    dec = _decode_steps(profile)
    lens = [s.get("input_len") for s in steps]
    long = [s for s in dec if (s.get("input_len") or 0) > 1]
    if len(long) * 2 < len(dec) or (dec[-1].get("input_len") or 0) <= (dec[0].get("input_len") or 0):
        return None
    ms = [s.get("ms") or 0.0 for s in dec]
    ops = [s.get("ops") or 0 for s in dec]
    numbers: dict[str, Any] = {"input_len_per_step": lens, "decode_ms_first_last": [ms[0], ms[-1]]}
    if any(ops):
        numbers["decode_ops_first_last"] = [ops[0], ops[-1]]
    evidence = (f"decode steps take {dec[0].get('input_len')} to {dec[-1].get('input_len')} positions each "
                f"(input length per step {lens}; one new token per step needs 1): the whole sequence runs again "
                f"every step, so step cost grows with the position ({ms[0]:.2f} ms at the first decode step, "
                f"{ms[-1]:.2f} ms at the last)")
    fix = None
    if profile.get("takes_past") and not any(s.get("past_in") for s in dec):
        tf = profile.get("transformers")
        cause = ("the step takes past_key_values but receives None at every decode step: the cache is dropped "
                 "between steps" + (f"; with transformers {tf} installed, a Cache API mismatch between the model's "
                                    "code and this transformers (legacy tuples vs Cache objects, a renamed "
                                    "generate hook) is the likely cause" if tf else ""))
        fix = _recipe("H8") if tf else None
    else:
        cause = "the generate loop feeds the whole sequence to every step: the model keeps no KV cache"
    return PerfFinding(kind="no-kv-cache", title="decode cost grows with the position (no or lost KV cache)",
                       where=profile.get("step_site"), evidence=evidence, numbers=numbers, cause=cause, fix=fix)


def _submodules_every_step(profile: dict[str, Any]) -> list[PerfFinding]:
    steps = profile["steps"]
    lens = {s.get("input_len") for s in steps}
    if None in lens or len(lens) < 2:
        return []  # without a changing step input, equal module inputs say nothing
    out: list[PerfFinding] = []
    flagged: list[str] = []
    for name, rec in (profile.get("modules") or {}).items():
        if any(name.startswith(f + ".") for f in flagged):
            continue  # its parent is the finding
        if len(rec.get("steps") or []) != len(steps) or not rec.get("constant_inputs"):
            continue
        flagged.append(name)
        n = len(steps)
        out.append(PerfFinding(
            kind="submodule-every-step", module=name, where=rec.get("site"),
            title=f"submodule `{name}` ({rec.get('class')}) runs in every decode step",
            evidence=(f"`{name}` ran {rec.get('calls')} times in one generate of {n} steps, in every step, with the "
                      f"same input shapes each time ({rec.get('signature')}) while the step input went from "
                      f"{steps[0].get('input_len')} to {steps[-1].get('input_len')} positions"),
            numbers={"calls_per_generate": rec.get("calls"), "steps": n},
            cause="its output does not depend on the tokens decoded so far; it should run once before the loop "
                  "(or be cached) and its result reused by every step"))
    return out


def _loop_events(profile: dict[str, Any], key: Literal["syncs", "fallbacks"]) -> PerfFinding | None:
    dec = _decode_steps(profile)
    per = [_loop_count(s, key) for s in dec]
    if sum(1 for n in per if n > 0) * 2 < len(dec) or not any(per):
        return None
    sites = _loop_sites(dec, "sync_sites" if key == "syncs" else "fallback_sites")
    top = next(iter(sites), None)
    where = top.rpartition(" @ ")[2] if top else None
    med = statistics.median(per)
    site_text = ", ".join(f"{k} x{v}" for k, v in list(sites.items())[:3]) or "sites not recorded"
    if key == "syncs":
        counted = ("host reads (.item(), .tolist(), ...)" if profile.get("counters") == "cpu-host-reads"
                   else "host syncs")
        return PerfFinding(
            kind="step-loop-syncs", where=where, title="host syncs inside the decode loop",
            evidence=f"{counted} in {sum(1 for n in per if n)} of {len(dec)} decode steps, median {med:g} per step "
                     f"(per step {per}); at {site_text}",
            numbers={"per_decode_step": per, "sites": sites},
            cause="each sync drains the device queue every step; the decision it serves can stay on the device",
            fix=_recipe("H6"))
    return PerfFinding(
        kind="step-loop-fallbacks", where=where, title="CPU fallbacks inside the decode loop",
        evidence=f"ops without an NPU kernel ran on the CPU in {sum(1 for n in per if n)} of {len(dec)} decode steps, "
                 f"median {med:g} per step (per step {per}); at {site_text}",
        numbers={"per_decode_step": per, "sites": sites},
        cause="each fallback copies its inputs to the host and back every step", fix=_recipe("H7"))


def _trend(xs: list[float]) -> float:
    """Correlation of the values with their position (1: grows steadily)."""
    if len(xs) < 3 or statistics.pstdev(xs) == 0:
        return 0.0
    return statistics.correlation(list(range(len(xs))), xs)


def _whole_output_decode(profile: dict[str, Any]) -> PerfFinding | None:
    dec = _decode_steps(profile)
    calls = [c for c in profile.get("decode_calls") or [] if c.get("len") is not None]
    if (len(calls) * 2 >= len(dec) + 1 and calls[-1]["len"] > calls[0]["len"]
            and _trend([c["len"] for c in calls]) > 0.9):
        lens = [c["len"] for c in calls]
        return PerfFinding(
            kind="whole-output-decode", where=calls[-1].get("site"), title="the whole output is decoded every step",
            evidence=f"tokenizer decode ran {len(calls)} times in one generate of {len(profile['steps'])} steps on "
                     f"{lens[0]} to {lens[-1]} tokens (lengths {lens}): each step decodes everything so far, so the "
                     "loop's cost grows with the output length",
            numbers={"decode_calls": len(calls), "decoded_lengths": lens, "decode_ms": [c.get("ms") for c in calls]},
            cause="a stop check or streamer decodes the whole output to look for a stop string",
            fix=None)
    gaps = [float((s.get("gap") or {}).get("ms") or 0.0) for s in dec]
    if len(gaps) >= 6:
        third = len(gaps) // 3
        early, late = statistics.median(gaps[:third]), statistics.median(gaps[-third:])
        if _trend(gaps) > 0.9 and late > 3 * max(early, 1e-3) and late > 1.0:
            return PerfFinding(
                kind="whole-output-decode", where=profile.get("step_site"),
                title="loop time outside the model grows with the position",
                evidence=f"time between decode steps grows from {early:.2f} ms to {late:.2f} ms (per step "
                         f"{gaps}) while the steps themselves do not explain it",
                numbers={"gap_ms": gaps}, cause="work over the whole output each step (decoding, n-gram filters)")
    return None


def find_pathologies(profile: dict[str, Any] | None) -> list[PerfFinding]:
    """The pathologies of one profile (empty when it has too few steps to judge)."""
    if not profile or len(profile.get("steps") or []) < MIN_STEPS:
        return []
    found: list[PerfFinding | None] = [_no_kv_cache(profile)]
    found += _submodules_every_step(profile)
    found += [_loop_events(profile, "syncs"), _loop_events(profile, "fallbacks"), _whole_output_decode(profile)]
    return [f for f in found if f is not None]


def _key(f: PerfFinding) -> tuple[str, str | None]:
    return f.kind, f.module


def _rows(ref: dict[str, Any] | None, port: dict[str, Any]) -> list[dict[str, Any]]:
    r_steps = (ref or {}).get("steps") or []
    counts_ops = port.get("counters") == "device-ops"  # the profile says what it counted (sandbox/harness/profile.py)
    rows = []
    for i, s in enumerate(port.get("steps") or []):
        r = r_steps[i] if i < len(r_steps) else {}
        rows.append({"step": i, "input_len": s.get("input_len"), "ref_input_len": r.get("input_len"),
                     "ms": s.get("ms"), "ref_ms": r.get("ms"), "ops": s.get("ops") if counts_ops else None,
                     "syncs": _loop_count(s, "syncs"), "ref_syncs": _loop_count(r, "syncs") if r else None,
                     "fallbacks": _loop_count(s, "fallbacks"), "cache_bytes": s.get("cache_bytes"),
                     "ref_cache_bytes": r.get("cache_bytes")})
    return rows


def analyse(port: dict[str, Any] | None, reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """The perf evidence of a port: its pathologies (each marked as inherited from the original or not),
    and both profiles side by side per step."""
    if not port:
        return {"profiled": False, "pathologies": [], "note": "no decode profile (profiling off or the run had none)"}
    found = find_pathologies(port)
    ref_keys = {_key(f) for f in find_pathologies(reference)} if reference else None
    for f in found:
        f.in_original = None if ref_keys is None else _key(f) in ref_keys
    note = "" if len(port.get("steps") or []) >= MIN_STEPS else f"fewer than {MIN_STEPS} steps: no trend to judge"
    return {"profiled": True, "pathologies": [f.model_dump(mode="json") for f in found], "note": note,
            "port": port, "reference": reference, "rows": _rows(reference, port)}


def profile_of(result_path: str | Path) -> dict[str, Any] | None:
    try:
        res = json.loads(Path(result_path).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    prof = res.get("profile")
    return prof if isinstance(prof, dict) else None


def verdict(status: str, perf: dict[str, Any] | None, coverage: dict[str, Any] | None = None) -> str:
    """"validated" / "validated (partial: <kinds not run>)" (agents/validation/coverage.py) / "validated, with 2
    performance pathologies" / the status itself."""
    from agents.validation.coverage import partial_words

    n = len((perf or {}).get("pathologies") or [])
    if status != "validated":
        return status
    partial = partial_words(coverage)
    words = f"validated ({partial})" if partial else "validated"
    return f"{words}, with {n} performance patholog{'y' if n == 1 else 'ies'}" if n else words


def shown_where(pathology: dict[str, Any]) -> str:
    """What a printer shows for a pathology: the site in the user's own file when it was mapped."""
    return str(pathology.get("user_where") or pathology.get("where") or "?")


def summary_lines(perf: dict[str, Any] | None) -> list[str]:
    """One line per pathology: what, where, the numbers' sentence, cause and fix."""
    out = []
    for p in (perf or {}).get("pathologies") or []:
        origin = {True: " (also in the original)", False: " (introduced by the port)"}.get(p.get("in_original"), "")
        out.append(f"{p['title']}{origin} at {shown_where(p)}: {p['evidence']}. Likely cause: {p['cause']}."
                   + (f" Fix: {p['fix']}." if p.get("fix") else ""))
    return out


def strict_failure(perf: dict[str, Any] | None) -> str | None:
    """The failure reason under --strict-perf, or None when the profile shows no pathology."""
    found = (perf or {}).get("pathologies") or []
    if not found:
        return None
    titles = "; ".join(f"{p['title']} at {shown_where(p)}" for p in found)
    n = len(found)
    return f"--strict-perf: greedy tokens match, but {n} performance patholog{'y' if n == 1 else 'ies'}: {titles}"


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return "n/m" if v is None else (fmt.format(v) if isinstance(v, float) else str(v))


def perf_markdown(perf: dict[str, Any] | None, status: str, plot: str | None = None) -> list[str]:
    """The report's "Decode profile" section: the verdict, each pathology, and the per-step table."""
    lines = ["## Decode profile (original vs port, same runs as validation)", ""]
    if not perf or not perf.get("profiled"):
        return lines + [f"- not profiled: {(perf or {}).get('note') or 'no profile in the runs'}", ""]
    port = perf.get("port") or {}
    lines += [f"- verdict: **{verdict(status, perf)}**",
              f"- counters: {port.get('counters')}; step = `{port.get('step')}` (one call per decode step); "
              f"{len(port.get('steps') or [])} steps in one generate"
              + (f"; {perf['note']}" if perf.get("note") else "")]
    if port.get("error"):
        lines.append(f"- profiler stopped early: {port['error']}")
    for line in summary_lines(perf):
        lines.append(f"- {line}")
    if not perf.get("pathologies"):
        lines.append("- no performance pathology found")
    lines += ["", "| step | input len (orig / port) | ms (orig / port) | port ops | syncs (orig / port) | "
              "port fallbacks | cache bytes (orig / port) |", "|---|---|---|---|---|---|---|"]
    for r in perf.get("rows") or []:
        lines.append(f"| {r['step']} | {_num(r['ref_input_len'])} / {_num(r['input_len'])} | {_num(r['ref_ms'])} / "
                     f"{_num(r['ms'])} | {_num(r['ops'])} | {_num(r['ref_syncs'])} / {_num(r['syncs'])} | "
                     f"{_num(r['fallbacks'])} | {_num(r['ref_cache_bytes'])} / {_num(r['cache_bytes'])} |")
    lines += ["", "n/m: not measured (the profile of that run has no such counter or step)."]
    if plot:
        lines += ["", f"![decode profile]({plot})"]
    return lines + [""]
