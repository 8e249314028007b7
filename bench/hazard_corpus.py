"""Hazard corpus: scan recall over planted hazards, and ports of every corpus repo on cpu and ascend-sim.

The corpus (tests/hazard_corpus/<repo>/) is small model repos written for this purpose, each mixing hazard
classes; every planted hazard is annotated on its line with ``# HAZARD: <rule-id>[, <rule-id>]``. Recall
is the share of planted (file, line, rule id) the scanner reports. Each repo is then ported with
``npuport port`` on each target (a real sandbox run each time); the table shows the status and the
sandbox runs per port. Goals: recall >= 95 % and every port validated on both targets. The last line is
the figure; the exit status is 1 when a goal is missed.

Usage: python bench/hazard_corpus.py [--targets cpu,ascend-sim] [--scan-only] [repos...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "hazard_corpus"
RECALL_GOAL = 0.95
_PLANT = re.compile(r"#\s*HAZARD:\s*([\w\-, ]+)$")


def planted(repo: Path) -> set[tuple[str, int, str]]:
    out: set[tuple[str, int, str]] = set()
    for path in sorted(repo.rglob("*.py")):
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = _PLANT.search(line)
            if m:
                out |= {(path.relative_to(repo).as_posix(), no, r.strip()) for r in m.group(1).split(",") if r.strip()}
    return out


def recall(repo: Path) -> tuple[int, int, list[str]]:
    from agents.reading.scanner import scan_tree

    found = {(f.file, f.line, f.rule) for f in scan_tree(repo).findings}
    want = planted(repo)
    missed = sorted(want - found)
    return len(want) - len(missed), len(want), [f"{f}:{n} {r}" for f, n, r in missed]


def port_once(repo: Path, target: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bundle"
        env = dict(os.environ, NPUPORT_HOME=os.environ.get("NPUPORT_HOME", str(Path(tmp) / "home")))
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "api.cli", "port", str(repo), "--target", target, "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - start
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    counters = report.get("counters") or {}
    return {"status": report.get("status") or "no report", "runs": counters.get("port_runs", 0),
            "reason": (report.get("reason") or "")[:90], "wall_s": round(wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="cpu,ascend-sim")
    ap.add_argument("--scan-only", action="store_true")
    ap.add_argument("repos", nargs="*", default=[str(p) for p in sorted(CORPUS.iterdir()) if p.is_dir()])
    args = ap.parse_args()
    targets = [] if args.scan_only else [t for t in args.targets.split(",") if t]
    head = f"{'repo':<26} {'planted':>7} {'found':>5}" + "".join(f" {t + ' status':>22} {'runs':>4}" for t in targets)
    print(head)
    hit = total = 0
    validated = ports = 0
    misses: list[str] = []
    for r in args.repos:
        repo = Path(r)
        h, n, missed = recall(repo)
        hit, total = hit + h, total + n
        misses += [f"{repo.name}/{m}" for m in missed]
        line = f"{repo.name:<26} {n:>7} {h:>5}"
        for t in targets:
            row = port_once(repo, t)
            ports += 1
            validated += row["status"] == "validated"
            line += f" {row['status']!s:>22} {row['runs']:>4}"
            if row["status"] != "validated":
                misses.append(f"{repo.name} on {t}: {row['reason']}")
        print(line, flush=True)
    for m in misses:
        print(f"  miss: {m}")
    rec = hit / total if total else 0.0
    ok = rec >= RECALL_GOAL and validated == ports
    ports_txt = f"; validated ports {validated}/{ports} ({', '.join(targets)})" if targets else ""
    print(f"hazard_corpus: scan recall {hit}/{total} = {rec:.1%} (goal >= {RECALL_GOAL:.0%}){ports_txt} -> "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
