"""report.md's "Coverage" section: which module kinds of the model the validation evidence covers (the layer
kinds, the layer types the config names, the towers and parts that ran in the port and the reference), and the
modules that did not run. Read from report.json ``coverage`` (agents/validation/coverage.py)."""

from __future__ import annotations

from typing import Any

MAX_MODULES_LISTED = 24

_ROLE_WORDS = {"layer": "layer kind", "layer type": "layer type (config)", "tower": "tower (config)",
               "part": "part"}


def _ran_text(value: Any) -> str:
    return {True: "ran", False: "**did not run**", None: "not recorded"}.get(value, str(value))


def _listed(names: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:MAX_MODULES_LISTED])
    return shown + (f" and {len(names) - MAX_MODULES_LISTED} more (report.json)" if len(names) > MAX_MODULES_LISTED
                    else "")


def coverage_markdown(report: dict[str, Any]) -> list[str]:
    """The Coverage section; nothing when no run recorded what ran."""
    cov = report.get("coverage") or {}
    if not cov.get("recorded"):
        errors = cov.get("errors") or []
        return ["## Coverage", "", f"- not recorded: {'; '.join(errors)}", ""] if errors else []
    gaps = cov.get("not_covered") or []
    head = (f"**partial**: {len(gaps)} module kind(s) did not run, so the comparison says nothing about them"
            if gaps else "every module kind recorded ran in both the port and the reference")
    lines = ["## Coverage (which parts of the model the evidence covers)", "", f"- {head}", "",
             "| kind | what | port | reference |", "|---|---|---|---|"]
    for k in cov.get("kinds") or []:
        what = _ROLE_WORDS.get(str(k.get("role")), str(k.get("role")))
        if k.get("why"):
            what += f" ({k['why']})"
        lines.append(f"| `{k['kind']}` | {what} | {_ran_text(k.get('port'))} | {_ran_text(k.get('reference'))} |")
    lines.append("")
    if cov.get("ran"):
        lines.append(f"- modules that ran (port): {_listed(cov['ran'])}")
    if cov.get("not_run"):
        lines.append(f"- modules that did not run (port): {_listed(cov['not_run'])} (a single layer whose weights the "
                     "code reads directly, a tied head or a position table, shows here without being a gap)")
    return [*lines, ""]
