"""What the validation evidence covers: the module kinds that ran in both compared runs.

Each harness run records which layer kinds, towers and parts of the model ran (sandbox/harness/coverage.py).
The validator merges the port's record with the reference's: a kind that did not run in either (a vision tower
the inputs never reached, a layer type the shrunk config no longer has) is not covered, and a port whose
tokens match is then "validated (partial: <kinds not run>)": the exit code stays 0, the words say partial
(the verdict, the CLI's last line, report.md's summary and its Coverage section, report.json ``coverage``).
A kind the record could not place on a module (``ran`` None: no layer stack as long as the config's level)
is listed, not counted.
"""

from __future__ import annotations

from typing import Any

from agents.models import RunRecord

MAX_NAMED = 4  # kinds named in the verdict's words; the report lists them all


def merged_coverage(port: RunRecord, ref: RunRecord | None) -> dict[str, Any]:
    """{recorded, kinds: [{kind, role, modules, port, reference, why}], not_covered: [kind], ran, not_run}: each
    kind with whether it ran in the port and in the reference (None where that run did not record it)."""
    kinds: dict[str, dict[str, Any]] = {}
    sides = [(port, "port"), *([(ref, "reference")] if ref is not None else [])]
    for run, side in sides:
        for k in (run.coverage or {}).get("kinds") or []:
            entry = kinds.setdefault(str(k.get("kind")), {"kind": str(k.get("kind")), "role": k.get("role"),
                                                          "modules": list(k.get("modules") or []),
                                                          "port": None, "reference": None})
            entry[side] = k.get("ran")
            if k.get("why"):
                entry["why"] = k["why"]
    recorded = [run for run, _ in sides if (run.coverage or {}).get("kinds") is not None]
    errors = [f"{side}: {run.coverage['error']}" for run, side in sides if (run.coverage or {}).get("error")]
    port_cov = port.coverage or {}
    return {"recorded": bool(recorded), "kinds": list(kinds.values()),
            "not_covered": [k["kind"] for k in kinds.values() if k["port"] is False or k["reference"] is False],
            "ran": list(port_cov.get("ran") or []), "not_run": list(port_cov.get("not_run") or []),
            **({"errors": errors} if errors else {})}


def not_covered(coverage: dict[str, Any] | None) -> list[str]:
    return list((coverage or {}).get("not_covered") or [])


def partial_words(coverage: dict[str, Any] | None) -> str:
    """"partial: audio_tower (AudioEncoder), ..." or "" when the evidence covers every kind recorded."""
    gaps = not_covered(coverage)
    if not gaps:
        return ""
    named = ", ".join(gaps[:MAX_NAMED]) + (f" and {len(gaps) - MAX_NAMED} more" if len(gaps) > MAX_NAMED else "")
    return f"partial: {named}"


def coverage_reason(coverage: dict[str, Any] | None) -> str:
    """The sentence the verdict's reason gains when the evidence is partial."""
    gaps = not_covered(coverage)
    if not gaps:
        return ""
    return (f"the evidence does not cover {len(gaps)} module kind(s) of the model ({', '.join(gaps)}): they did "
            "not run in the compared runs, so nothing was compared for them (see Coverage)")
