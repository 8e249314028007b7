"""The layering in pyproject.toml ([tool.importlinter]) holds: api -> graph -> agents -> sandbox -> knowledge,
graph nodes apart, hazard rules never import nodes, no import cycles between sibling modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout
