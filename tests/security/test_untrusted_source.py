"""Class: untrusted source is parsed outside npuport's process first. 100 KB of ``-`` overflows libcst's
native parser (SIGSEGV: the whole service and every owner's jobs); a slow file holds the GIL. The
planner refuses such a folder, naming the file, after parsing it in a child with time, memory and
stack limits; a folder that parses is checked once per content."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.isolation import parse_guard

CRASHER = "x = " + "-" * 100_000 + "1\n"


def _model(root: Path, extra: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    (root / "modeling_ok.py").write_text("import torch\n\nclass M(torch.nn.Module):\n    pass\n")
    for name, text in extra.items():
        (root / name).write_text(text)
    return root


def test_the_crasher_really_kills_an_unguarded_parser(tmp_path: Path) -> None:
    """The attack is real: parsing it in-process with libcst ends the process with a signal."""
    f = tmp_path / "c.py"
    f.write_text(CRASHER)
    done = subprocess.run([sys.executable, "-c", f"import libcst; libcst.parse_module(open({str(f)!r}).read())"],
                          capture_output=True, timeout=120)
    assert done.returncode < 0 or done.returncode > 128, done.returncode


def test_the_planner_refuses_a_file_that_crashes_the_parser(tmp_path: Path) -> None:
    from agents.nodes.planner import planner_node

    model = _model(tmp_path / "m", {"modeling_bomb.py": CRASHER})
    out = planner_node({"goal": "", "request": {"model_path": str(model), "target": "cpu"}})
    assert out.get("status") == "failed", out.get("reason")
    assert "modeling_bomb.py" in out["reason"] and "untrusted source" in out["reason"]


def test_a_stalling_parse_is_cut_off(tmp_path: Path) -> None:
    model = _model(tmp_path / "m", {"big.py": "x = 1\n" * 400_000})
    problem = parse_guard.source_problem(model, timeout_s=0.2)
    assert problem is not None and "took over" in problem


def test_a_clean_folder_passes_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path / "m", {"syntax_error.py": "def f(:\n"})  # a syntax error is the scanner's to say
    assert parse_guard.source_problem(model) is None
    calls: list[object] = []
    real_run = subprocess.run
    monkeypatch.setattr(parse_guard.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    assert parse_guard.source_problem(model) is None and not calls  # remembered by digest
    (model / "modeling_ok.py").write_text("y = 2\n")  # new content: checked again
    assert parse_guard.source_problem(model) is None and len(calls) == 1
