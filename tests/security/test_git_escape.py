"""Class: escape through npuport's own git. The model (at run time, or through a patch that lands in
its tree) plants hooks, core.fsmonitor, diff.external, a pager or a .gitattributes filter; none of
them may run when npuport next commits or diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.workspace import GIT_DIR_NAME, Workspace, tree_digest

from .conftest import write_model

# What each planted program does: touch a marker beside the workspace (outside every sandbox).
PLANTS = {
    "hook": ("hooks/pre-commit", "hooks/post-commit", "hooks/post-checkout"),
    "config": ("core.fsmonitor", "diff.external", "core.pager", "core.hooksPath"),
}


def _plant_code(git_dir: str, model_dir: str, marker: str) -> str:
    """Python run by the hostile model: write every git escape it can reach; errors are expected
    where the sandbox hides or protects the target."""
    cmd = f"#!/bin/sh\ntouch {marker}\n"
    return f'''
def _plant():
    import os, stat
    gd, md, cmd = {git_dir!r}, {model_dir!r}, {cmd!r}
    def w(p, text, exe=False):
        try:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as fh:
                fh.write(text)
            if exe:
                os.chmod(p, 0o755)
        except OSError:
            pass
    for d in (gd, os.path.join(md, ".git")):
        for hook in ("pre-commit", "post-commit", "post-checkout", "pre-auto-gc", "reference-transaction"):
            w(os.path.join(d, "hooks", hook), cmd, exe=True)
        w(os.path.join(d, "evil.sh"), cmd, exe=True)
        w(os.path.join(d, "config"), "[core]\\n\\tfsmonitor = " + os.path.join(d, "evil.sh") +
          "\\n\\tpager = " + os.path.join(d, "evil.sh") + "\\n\\thooksPath = " + os.path.join(d, "hooks") +
          "\\n[diff]\\n\\texternal = " + os.path.join(d, "evil.sh") +
          "\\n[filter \\"evil\\"]\\n\\tclean = " + os.path.join(d, "evil.sh") +
          "\\n\\tsmudge = " + os.path.join(d, "evil.sh") +
          "\\n\\tprocess = " + os.path.join(d, "evil.sh") + "\\n")
        w(os.path.join(d, "info", "attributes"), "* filter=evil diff=evil\\n")
    w(os.path.join(md, ".gitattributes"), "* filter=evil diff=evil\\n")
    w(os.path.join(md, "changed.py"), "x = 1\\n")
_plant()
'''


def _exercise(ws) -> None:  # type: ignore[no-untyped-def]
    """Every git call npuport makes on a workspace after a run."""
    ws.commit("after the hostile run")
    ws.diff_from_original()
    ws.changed_files(ws.head())
    (ws.model_dir / "another.py").write_text("y = 2\n")
    ws.commit("a later patch")
    ws.restore()
    ws.original_tree(ws.root / "original-copy")


def test_planted_git_programs_never_run(attack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "git-escape-ran"
    work = tmp_path / "work"
    a = attack(_plant_code(str(work / GIT_DIR_NAME), str(work / "model"), str(marker)))
    assert a.run.ok, a.run.result
    _exercise(a.ws)
    assert not marker.exists(), "a program planted for git ran outside the sandbox"
    assert a.original_untouched()


def test_patch_that_adds_a_gitattributes_filter_and_config_runs_nothing(tmp_path: Path) -> None:
    """The same plants written straight into the workspace (what a patch, or a process-mode run, can do)."""
    original = write_model(tmp_path / "user-model")
    before = tree_digest(original)
    ws = Workspace.create(original, tmp_path / "work")
    marker = tmp_path / "git-escape-ran"
    exec(_plant_code(str(ws.git_dir), str(ws.model_dir), str(marker)), {})  # noqa: S102 - the attack itself
    assert (ws.model_dir / ".gitattributes").exists() and "fsmonitor" in (ws.git_dir / "config").read_text()
    _exercise(ws)
    assert not marker.exists(), "a program planted for git ran"
    assert tree_digest(original) == before


def test_git_gets_no_server_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIT_* variables of the server (an external diff, a config file, a pager) are not passed to git."""
    marker = tmp_path / "env-escape-ran"
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\n")
    evil.chmod(0o755)
    cfg = tmp_path / "evil.gitconfig"
    cfg.write_text(f"[core]\n\tfsmonitor = {evil}\n[diff]\n\texternal = {evil}\n")
    for k, v in {"GIT_EXTERNAL_DIFF": str(evil), "GIT_CONFIG_GLOBAL": str(cfg), "GIT_PAGER": str(evil),
                 "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor",
                 "GIT_CONFIG_VALUE_0": str(evil)}.items():
        monkeypatch.setenv(k, v)
    ws = Workspace.create(write_model(tmp_path / "user-model"), tmp_path / "work")
    _exercise(ws)
    assert not marker.exists()


def test_git_repository_is_outside_the_model_tree(tmp_path: Path) -> None:
    ws = Workspace.create(write_model(tmp_path / "user-model"), tmp_path / "work")
    assert not (ws.model_dir / ".git").exists()
    assert ws.git_dir.is_dir() and not ws.git_dir.is_relative_to(ws.model_dir)
