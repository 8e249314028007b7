"""One settings module declares every NPUPORT_* variable; the README's Configuration table and
`npuport settings` list each of them; modules read them through it at call time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from knowledge.settings import LLMSettings, ServiceSettings, env_table, settings
from tests.conftest import REPO_ROOT

# Names that look like settings but are not environment variables (a path constant, prose prefixes).
NOT_VARIABLES = {"NPUPORT_ROOT", "NPUPORT_", "NPUPORT_LLM_"}


def _declared() -> set[str]:
    return {var for var, _, _ in env_table()}


def test_every_variable_the_code_mentions_is_declared() -> None:
    used: set[str] = set()
    for pkg in ("agents", "graph", "knowledge", "sandbox", "api"):
        for f in (REPO_ROOT / pkg).rglob("*.py"):
            used |= set(re.findall(r"NPUPORT_[A-Z_]*", f.read_text()))
    assert used - NOT_VARIABLES - _declared() == set()


def test_readme_and_help_list_every_variable() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`(NPUPORT_[A-Z_]+)`", table)) == _declared()
    from api.cli import app

    out = CliRunner().invoke(app, ["settings"], env={"COLUMNS": "300"}).stdout
    flat = "".join(out.split())  # a table cell may still fold a long name
    assert [var for var in _declared() if var not in flat] == []
    short = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"}).stdout
    assert "npuport settings" in short and not any(var in short for var in _declared())  # a short --help


def test_settings_are_read_at_call_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.tuning.port import budget_of
    from knowledge.home import npuport_home

    monkeypatch.setenv("NPUPORT_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("NPUPORT_TUNE_TRIALS", "5")
    assert npuport_home() == tmp_path / "h" and (tmp_path / "h").is_dir()
    assert budget_of({"max_wall_s": 100}).max_trials == 5
    assert budget_of({"max_wall_s": 100, "tune_trials": 3}).max_trials == 3
    monkeypatch.setenv("NPUPORT_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("NPUPORT_LLM_MODEL", "m")
    assert LLMSettings().configured
    monkeypatch.setenv("NPUPORT_TOKENS", "a=read,b=read+write")
    assert ServiceSettings().tokens == {"a": ["read"], "b": ["read", "write"]}
    assert ServiceSettings().resolved_home() == (tmp_path / "h").resolve()
    assert settings().kb_off is False
