"""Importing graph / api (what the CLI and langgraph dev load first) must not load torch, chromadb or
sentence-transformers: they cost seconds and are only needed inside sandboxes and the KB."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "chromadb", "sentence_transformers", "transformers", "torch_npu")


@pytest.mark.parametrize("module", ["graph", "graph.builder", "graph.runner", "api", "api.cli", "agents.policies",
                                    "knowledge.kb"])
def test_import_does_not_load_heavy_modules(module: str) -> None:
    code = (f"import json, sys, {module}; "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_sandbox_and_knowledge_never_import_agents_or_graph() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = []
    for pkg in ("sandbox", "knowledge"):
        for f in (root / pkg).rglob("*.py"):
            text = f.read_text()
            for line in text.splitlines():
                s = line.strip()
                if s.startswith(("from agents", "import agents", "from graph", "import graph", "from api",
                                 "import api")):
                    offenders.append(f"{f.relative_to(root)}: {s}")
    assert offenders == []
