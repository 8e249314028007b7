"""Port time: runs `npuport port <example> --target <t>` and prints wall time and sandbox runs.

Goals (issue "walking skeleton"), judged per model: wall time under 60 s on a 2-core machine, and
sandbox runs of the port <= 1 + the distinct failures that no recipe covers. Diagnosed failures are not
all excused: a failure the debugger fixed with a recipe's codemod (or by reverting one of npuport's own
changes) is one the static scan should have predicted and patched before the first run, and the same
failure seen twice (one signature) excuses one run, not two. So a port that needs a recipe fix after
running, or loops on one failure, misses the goal. The last line is the figure; the exit status is 1
when a goal is missed. Usage: python bench/port_time.py [--target cpu] [examples...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WALL_GOAL_S = 60.0


def recipe_fixes() -> set[str]:
    """Names of the fixes the hazard rules (recipes) own, plus reverting one of npuport's own changes."""
    sys.path.insert(0, str(ROOT))
    from agents.fixing.diagnosis import REVERT_FIX
    from agents.rules.registry import RULES

    return {f.codemod for r in RULES for f in r.fixes} | {REVERT_FIX}


def unpredicted_failures(diagnoses: list[dict[str, Any]]) -> set[str]:
    """Distinct signatures of the failures no recipe fixed: the only ones that excuse a sandbox run."""
    known = recipe_fixes()
    return {str(d.get("signature") or d.get("id")) for d in diagnoses if d.get("fix") not in known}


def port_once(model: Path, target: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bundle"
        env = dict(os.environ, NPUPORT_HOME=os.environ.get("NPUPORT_HOME", str(Path(tmp) / "home")))
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "api.cli", "port", str(model), "--target", target, "--out", str(out)],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - start
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    diagnoses = report.get("diagnoses") or []
    unpredicted = len(unpredicted_failures(diagnoses))
    runs = (report.get("counters") or {}).get("port_runs", 0)
    return {"model": model.name, "target": target, "exit": r.returncode, "status": report.get("status"),
            "wall_s": round(wall, 1), "port_runs": runs,
            "reference_runs": (report.get("counters") or {}).get("reference_runs", 0),
            "failures_no_recipe_predicted": unpredicted, "diagnoses": len(diagnoses),
            "runs_goal_met": r.returncode == 0 and runs <= 1 + unpredicted,
            "time_goal_met": r.returncode == 0 and wall < WALL_GOAL_S}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cpu")
    ap.add_argument("models", nargs="*", default=[str(p) for p in sorted((ROOT / "examples").iterdir()) if p.is_dir()])
    args = ap.parse_args()
    print(f"{'model':<12} {'target':<11} {'status':<10} {'wall s':>7} {'<60s':>5} {'port runs':>9} {'ref runs':>8} "
          f"{'diagnoses':>9} {'no recipe':>9} {'runs ok':>7}")
    rows = []
    for m in args.models:
        row = port_once(Path(m), args.target)
        rows.append(row)
        print(f"{row['model']:<12} {row['target']:<11} {row['status']!s:<10} {row['wall_s']:>7} "
              f"{'yes' if row['time_goal_met'] else 'no':>5} {row['port_runs']:>9} {row['reference_runs']:>8} "
              f"{row['diagnoses']:>9} {row['failures_no_recipe_predicted']:>9} "
              f"{'yes' if row['runs_goal_met'] else 'no':>7}")
    ok = bool(rows) and all(r["time_goal_met"] and r["runs_goal_met"] for r in rows)
    worst = max((float(str(r["wall_s"])) for r in rows), default=0.0)
    print(f"port_time (load {os.getloadavg()[0]:.1f}): slowest port {worst:.1f} s (goal < {WALL_GOAL_S:.0f} s); "
          f"run-count goal met by {sum(1 for r in rows if r['runs_goal_met'])}/{len(rows)} -> "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
