"""Port time: runs `npuport port <example> --target <t>` and prints wall time and sandbox runs.

Targets (issue "walking skeleton"): under 60 s on a 2-core machine; sandbox runs of the port
<= 1 + the failures no recipe predicted. Usage: python bench/port_time.py [--target cpu] [examples...]
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

ROOT = Path(__file__).resolve().parents[1]


def port_once(model: Path, target: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bundle"
        env = dict(os.environ, NPUPORT_HOME=os.environ.get("NPUPORT_HOME", str(Path(tmp) / "home")))
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "api.cli", "port", str(model), "--target", target, "--out", str(out)],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - start
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
    # Every failed run is one the static scan did not predict (predicted hazards are patched before
    # the first run), whether or not the debugger then had a recipe for it.
    diagnoses = report.get("diagnoses") or []
    unpredicted = len(diagnoses)
    runs = (report.get("counters") or {}).get("port_runs", 0)
    return {"model": model.name, "target": target, "exit": r.returncode, "status": report.get("status"),
            "wall_s": round(wall, 1), "port_runs": runs, "reference_runs": (report.get("counters") or {}).get("reference_runs", 0),
            "failures_no_recipe_predicted": unpredicted,
            "runs_goal_met": runs <= 1 + unpredicted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cpu")
    ap.add_argument("models", nargs="*", default=[str(p) for p in sorted((ROOT / "examples").iterdir()) if p.is_dir()])
    args = ap.parse_args()
    print(f"{'model':<12} {'target':<11} {'status':<10} {'wall s':>7} {'port runs':>9} {'ref runs':>8} {'<=1+unpredicted':>16}")
    for m in args.models:
        row = port_once(Path(m), args.target)
        print(f"{row['model']:<12} {row['target']:<11} {row['status']!s:<10} {row['wall_s']:>7} {row['port_runs']:>9} "
              f"{row['reference_runs']:>8} {'yes' if row['runs_goal_met'] else 'no':>16}")
    print("goal: wall < 60 s on 2 cores; port runs <= 1 + failures no recipe predicted")


if __name__ == "__main__":
    main()
