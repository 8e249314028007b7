"""The CLI's input checks: everything a user can get wrong is refused before the graph starts (exit 2)."""

from __future__ import annotations

import shutil
from pathlib import Path


def model_folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a model folder, or None. Hidden folders (.git, .venv) do not count."""
    if not path.exists():
        return f"model path {path} does not exist"
    if not path.is_dir():
        return f"model path {path} is not a folder (give the folder that holds the model's code)"
    if not any(path.iterdir()):
        return f"model folder {path} is empty"
    if not any(not any(part.startswith(".") for part in p.relative_to(path).parts) for p in path.rglob("*.py")):
        return f"model folder {path} has no Python files: npuport ports PyTorch source code"
    return None


def goal_problem(goal: str) -> str | None:
    """Unknown chip or target named in the goal text (the planner's parser says which)."""
    from agents.request import goal_words_problem

    return goal_words_problem(goal)


def out_dir_problem(out: Path, model: Path, force: bool) -> str | None:
    """An out dir that holds anything is refused unless --force; --force never deletes the model."""
    out_r, model_r = out.expanduser().resolve(), model.expanduser().resolve()
    if out_r == model_r or out_r.is_relative_to(model_r) or model_r.is_relative_to(out_r):
        return f"--out {out} overlaps the model folder {model}; the original is never written"
    if out_r.exists() and not out_r.is_dir():
        return f"--out {out} exists and is not a folder"
    if out_r.is_dir() and any(out_r.iterdir()) and not force:
        return f"--out {out} already holds files; pass --force to replace them, or choose another --out"
    return None


def clear_out_dir(out: Path) -> None:
    """--force: a new report never sits beside stale plots of an earlier one."""
    out = out.expanduser()
    if out.is_symlink() or out.is_file():
        out.unlink()
    elif out.is_dir():
        shutil.rmtree(out)
