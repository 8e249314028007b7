"""The benches judge their goals: the figure is the last line and the exit status follows it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tuner_efficiency_reports_like_with_like_and_exits_on_its_verdict() -> None:
    r = subprocess.run([sys.executable, "bench/tuner_efficiency.py", "--seeds", "2", "--max-trials", "20"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = r.stdout.strip().splitlines()
    assert "with pr" in lines[1] and "without" in lines[1]  # every method with and without the prior
    last = lines[-1]
    assert last.startswith("tuner_efficiency:") and ("PASS" in last or "FAIL" in last)
    assert r.returncode == (0 if last.endswith("PASS") else 1)
