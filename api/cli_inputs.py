"""The CLI's input checks: everything a user can get wrong is refused before the graph starts (exit 2)."""

from __future__ import annotations

import shutil
from pathlib import Path

from knowledge.bundles import bundle_dir_problem


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
    if problem := bundle_dir_problem(out.expanduser()):
        return f"--out {problem}"
    if out_r.is_dir() and any(out_r.iterdir()) and not force:
        return (f"--out {out} holds an earlier npuport bundle; pass --force to replace it, "
                "or choose another --out")
    return None


def clear_out_dir(out: Path) -> None:
    """--force on npuport's own bundle: a new report never sits beside stale plots of an earlier one.
    Anything npuport did not write is refused, never removed (out_dir_problem said why first)."""
    out = out.expanduser()
    if not out.exists():
        return
    if problem := bundle_dir_problem(out):
        raise ValueError(problem)
    if any(out.iterdir()):
        shutil.rmtree(out)


def sources_problem(path: Path) -> str | None:
    """Python files that do not decode or parse (sandbox/isolation/source_check.py), each as file:line: reason."""
    from sandbox.isolation.source_check import check_sources

    problems = check_sources(path)
    if not problems:
        return None
    shown = "; ".join(str(p) for p in problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10
                                                        else "")
    return f"{len(problems)} Python file(s) in {path} cannot be read or parsed, nothing was run: {shown}"


def target_problem(target: str) -> str | None:
    """A target that needs real hardware (--target npu) on a host where its probe fails (torch_npu does not
    import, or sees no device): said before anything runs, rather than blamed on the model after a patch round."""
    from sandbox.targets import EMULATED_TARGET, TARGETS

    spec = TARGETS.get(target)
    if spec is None or not spec.needs_device or spec.probe is None:
        return None
    ok, why = spec.probe()
    return None if ok else (f"--target {target} needs its device on this host: {why} "
                            f"(try --target {EMULATED_TARGET})")
