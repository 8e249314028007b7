"""The batch's results table: results.csv, results.json and report.md, plus what ports learned and reused."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from graph.batch.store import BatchRow, PortRow

COLUMNS = ("model", "target", "verdict", "sandbox_runs", "llm_calls", "time_s", "hazards_found", "hazards_fixed",
           "speedup", "bundle", "reason", "attempts", "learned", "reused")


def memory_records(home: Path) -> list[dict[str, Any]]:
    from knowledge.port_memory import read_records

    return read_records(home)


def rows(batch: BatchRow, ports: list[PortRow], home: Path) -> list[dict[str, Any]]:
    """One row per port. ``learned``: port-memory records this port added during the batch; ``reused``:
    port-memory records it cited, with the port of this batch that learned each (or 'earlier')."""
    before = set(batch.spec.get("memory_before") or [])
    learned_by: dict[str, str] = {}
    by_port: dict[str, list[str]] = {}
    records = memory_records(home)
    what = {r["id"]: (f"fixes \"{r.get('failure') or r.get('signature') or '?'}\" with: "
                      f"{r.get('patch_summary', '')}")[:300]
            for r in records}
    for p in ports:
        name = Path((p.result or {}).get("model_path") or "-").name
        mine = [r["id"] for r in records if r["id"] not in before and r.get("model") == name]
        by_port[p.key] = mine
        for rid in mine:
            learned_by.setdefault(rid, p.key)
    out = []
    for p in ports:
        res = dict(p.result or {})
        cited = res.get("memory_cited") or []
        reused = [f"{rid} (from {learned_by.get(rid, 'earlier')})" for rid in dict.fromkeys(cited)
                  if learned_by.get(rid) != p.key]
        out.append({
            "model": p.key, "target": res.get("target") or p.spec.get("settings", {}).get("target", ""),
            "verdict": p.status if p.status in ("validated", "failed") else p.status,
            "sandbox_runs": res.get("sandbox_runs", 0), "llm_calls": res.get("llm_calls", 0),
            "time_s": res.get("time_s"),
            "hazards_found": res.get("hazards_found", 0), "hazards_fixed": res.get("hazards_fixed", 0),
            "speedup": res.get("speedup"), "bundle": res.get("bundle", ""),
            "reason": p.reason if p.status != "validated" else "", "attempts": p.attempts,
            "learned": by_port.get(p.key, []), "reused": reused,
            "learned_what": {rid: what.get(rid, "") for rid in [*by_port.get(p.key, []), *cited]},
        })
    return out


def write_results(batch: BatchRow, ports: list[PortRow], home: Path, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    table = rows(batch, ports, home)
    paths = {"json": out_dir / "results.json", "csv": out_dir / "results.csv", "md": out_dir / "report.md"}
    paths["json"].write_text(json.dumps({"batch": batch.id, "name": batch.name, "ports": table}, indent=1, default=str))
    with paths["csv"].open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in table:
            w.writerow({**{k: r[k] for k in COLUMNS}, "learned": ";".join(r["learned"]),
                        "reused": ";".join(r["reused"])})
    paths["md"].write_text(markdown(batch, table))
    return paths


def _fmt(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown(batch: BatchRow, table: list[dict[str, Any]]) -> str:
    n_ok = sum(1 for r in table if r["verdict"] == "validated")
    lines = [f"# Batch {batch.name} ({batch.id})", "",
             f"{n_ok} of {len(table)} ports validated.", "",
             "| model | target | verdict | sandbox runs | LLM calls | time (s) | hazards found / fixed | speedup "
             "| bundle | failure reason |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table:
        speed = f"{r['speedup']:.2f}x" if isinstance(r["speedup"], int | float) else "-"
        lines.append(f"| {_fmt(r['model'])} | {_fmt(r['target'])} | {_fmt(r['verdict'])} | {_fmt(r['sandbox_runs'])} "
                     f"| {_fmt(r['llm_calls'])} "
                     f"| {_fmt(r['time_s'])} | {r['hazards_found']} / {r['hazards_fixed']} | {speed} "
                     f"| {_fmt(r['bundle'])} | {_fmt(r['reason'])} |")
    lines += ["", "## Shared learning", ""]
    learned = [r for r in table if r["learned"] or r["reused"]]
    if not learned:
        lines.append("No port learned or reused a fix through the port memory (a port learns a fix that no recipe "
                     "covered once it validates with it, e.g. an LLM's edit; later ports apply it without the LLM).")
    for r in learned:
        if r["learned"]:
            lines.append(f"- {r['model']} learned: {', '.join(r['learned'])}")
            lines += [f"  - {rid}: {_fmt(r['learned_what'].get(rid))}" for rid in r["learned"]]
        if r["reused"]:
            lines.append(f"- {r['model']} reused: {', '.join(r['reused'])}")
            lines += [f"  - {rid.split(' ')[0]}: {_fmt(r['learned_what'].get(rid.split(' ')[0]))}"
                      for rid in r["reused"]]
    return "\n".join(lines) + "\n"
