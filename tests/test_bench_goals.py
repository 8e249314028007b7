"""The benches judge their goals: the figure is the last line and the exit status follows it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANDSCAPES = ROOT / "bench" / "landscapes"


def test_tuner_efficiency_reports_like_with_like_and_exits_on_its_verdict() -> None:
    r = subprocess.run([sys.executable, "bench/tuner_efficiency.py", "--seeds", "2", "--max-trials", "20"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = r.stdout.strip().splitlines()
    header = lines[1]
    for method in ("npup", "rand", "tpe"):  # every method under the same, a wrong and no prior
        for mode in ("same", "wrong", "no"):
            assert f"{method} {mode}" in header
    files = sorted(LANDSCAPES.glob("*.json"))
    rows = [ln for ln in lines[2:] if "/" in ln.split()[0]]
    assert len(rows) == len(files)  # one row per recorded landscape
    assert any(ln.startswith("mean over landscapes") for ln in lines)
    last = lines[-1]
    assert last.startswith("tuner_efficiency:") and ("PASS" in last or "FAIL" in last)
    assert r.returncode == (0 if last.endswith("PASS") else 1)


def test_tuner_landscapes_come_from_at_least_three_models() -> None:
    """The issue's like-with-like rule: one model's grids cannot stand for the tuner in general."""
    by_model: dict[str, set[str]] = {}
    for f in LANDSCAPES.glob("*.json"):
        data = json.loads(f.read_text())
        ok = [p for p in data["points"] if p["value"]]
        assert len(ok) >= 2, f"{f.name}: a landscape needs at least two points that ran"
        by_model.setdefault(data["model"], set()).add(data["name"])
    assert len(by_model) >= 3, by_model
    r = subprocess.run([sys.executable, "bench/tuner_efficiency.py", "--seeds", "1", "--max-trials", "20"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    seen = re.search(r"landscapes: (\d+) from (\d+) model", r.stdout)
    assert seen and int(seen.group(2)) == len(by_model) >= 3, r.stdout[-2000:]
