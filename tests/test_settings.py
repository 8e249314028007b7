"""One settings module declares every NPUPORT_* variable; the README's Configuration table and
`npuport settings` list each of them; modules read them through it at call time."""

from __future__ import annotations

import ast
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


# Modules that touch the process's environment outside knowledge/settings.py, and why they may.
ENV_TOUCHERS = {
    "sandbox/isolation/supervisor.py": "runs under `python -I -S` (standard library only): takes its result "
                                       "pipe's fd from the environment and keeps it from the worker",
    "sandbox/isolation/worker_channel.py": "runs under `python -I -S` in the sandboxed worker: takes its "
                                           "channel's fd from the environment",
    "sandbox/isolation/child_main.py": "runs in the sandboxed child without a supervisor: takes the result "
                                       "pipe's fd from the environment",
    "sandbox/harness/loading.py": "inside the sandboxed worker (the model's interpreter, which may lack "
                                  "pydantic): tells the Hub libraries they are offline before they load",
    "sandbox/targets/npu_runtime.py": "inside the sandboxed run on a real NPU: torch_npu reads "
                                      "TORCH_NPU_FALLBACK_CPU_DISABLE when it loads",
}
_WRITERS = {"setdefault", "pop", "popitem", "update", "clear", "__setitem__", "__delitem__"}


def _environment_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every NPUPORT_* variable read straight from the environment and every write to it
    (``os.environ`` by any name it is imported under, ``os.getenv``, ``os.putenv``, ``os.unsetenv``)."""
    os_names, environ_names, getenv_names = {"os"}, set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            environ_names |= {a.asname or a.name for a in node.names if a.name == "environ"}
            getenv_names |= {a.asname or a.name for a in node.names if a.name in ("getenv", "putenv", "unsetenv")}

    def is_environ(e: ast.AST) -> bool:
        return (isinstance(e, ast.Attribute) and e.attr == "environ" and isinstance(e.value, ast.Name)
                and e.value.id in os_names) or (isinstance(e, ast.Name) and e.id in environ_names)

    def os_function(e: ast.AST) -> str:
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in os_names:
            return e.attr
        return e.id if isinstance(e, ast.Name) and e.id in getenv_names else ""

    def npuport(e: ast.AST | None) -> bool:
        return isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value.startswith("NPUPORT_")

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            if not isinstance(node.ctx, ast.Load):
                found.append((node.lineno, "writes os.environ"))
            elif npuport(node.slice):
                found.append((node.lineno, "reads an NPUPORT_* variable"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_environ(node.func.value):
            if node.func.attr in _WRITERS:
                found.append((node.lineno, f"writes os.environ ({node.func.attr})"))
            elif node.func.attr == "get" and node.args and npuport(node.args[0]):
                found.append((node.lineno, "reads an NPUPORT_* variable"))
        elif isinstance(node, ast.Call) and os_function(node.func) in ("putenv", "unsetenv"):
            found.append((node.lineno, f"writes the environment ({os_function(node.func)})"))
        elif ((isinstance(node, ast.Call) and os_function(node.func) == "getenv" and node.args
               and npuport(node.args[0]))
              or (isinstance(node, ast.Compare) and npuport(node.left) and len(node.comparators) == 1
                  and is_environ(node.comparators[0]))):
            found.append((node.lineno, "reads an NPUPORT_* variable"))
    return found


def test_only_the_settings_module_reads_npuport_variables_or_writes_the_environment() -> None:
    offenders = []
    for pkg in ("agents", "graph", "knowledge", "sandbox", "api"):
        for f in sorted((REPO_ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(REPO_ROOT).as_posix()
            if rel == "knowledge/settings.py" or rel in ENV_TOUCHERS:
                continue
            offenders += [f"{rel}:{line}: {what}" for line, what in _environment_uses(ast.parse(f.read_text()))]
    assert offenders == [], "read NPUPORT_* through settings(), write through set_environment():\n" + "\n".join(
        offenders)


def test_the_environment_check_sees_each_form() -> None:
    src = ("import os\nfrom os import environ as env, getenv\n"
           "a = os.environ.get('NPUPORT_HOME')\nb = env['NPUPORT_X']\nc = getenv('NPUPORT_Y')\n"
           "d = 'NPUPORT_Z' in os.environ\nos.environ['K'] = '1'\nenv.setdefault('K', '1')\ndel os.environ['K']\n"
           "os.putenv('K', '1')\nfine = os.environ.get('PATH'), {**os.environ}, env['HOME']\n")
    assert [line for line, _ in _environment_uses(ast.parse(src))] == [3, 4, 5, 6, 7, 8, 9, 10]


def test_set_environment_refuses_an_undeclared_npuport_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from knowledge.settings import set_environment

    monkeypatch.setenv("NPUPORT_TUNE_TRIALS", "1")  # so that the test's own writes are undone after it
    monkeypatch.delenv("NPUPORT_TUNE_TRIALS")
    with pytest.raises(ValueError, match="NPUPORT_NO_SUCH"):
        set_environment({"NPUPORT_NO_SUCH": "1"})
    set_environment({"NPUPORT_TUNE_TRIALS": "4"})
    set_environment({"NPUPORT_TUNE_TRIALS": "9"}, keep_set=True)
    assert settings().tune_trials == 4


def test_isolation_choice_prefers_the_new_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPUPORT_ISOLATION", raising=False)
    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    assert settings().isolation_choice == "process"
    monkeypatch.setenv("NPUPORT_ISOLATION", "Auto")
    assert settings().isolation_choice == "auto"
    monkeypatch.delenv("NPUPORT_SANDBOX")
    monkeypatch.delenv("NPUPORT_ISOLATION")
    assert settings().isolation_choice == "auto"
