"""Every codemod in the rule registry has a meaning-preservation test: a test marked
``@pytest.mark.meaning("<codemod>")`` that runs the original and the rewritten code and compares them.
A codemod added without one fails here."""

from __future__ import annotations

import ast
from pathlib import Path

from agents.rules.registry import DEFAULT

TESTS = Path(__file__).resolve().parent


def meaning_marks() -> dict[str, list[str]]:
    """codemod -> the tests (file::name) marked as its meaning tests, read from the test sources."""
    out: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
                continue
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "meaning"
                        and dec.args and isinstance(dec.args[0], ast.Constant)):
                    out.setdefault(str(dec.args[0].value), []).append(f"{path.name}::{node.name}")
    return out


def test_every_registered_codemod_has_a_meaning_test() -> None:
    marks = meaning_marks()
    codemods = set(DEFAULT.codemods())
    missing = sorted(codemods - set(marks))
    assert not missing, f"codemods without a meaning test (@pytest.mark.meaning): {missing}"
    unknown = sorted(set(marks) - codemods)
    assert not unknown, f"meaning tests name codemods the registry does not have: {unknown}"
