"""What the model's code imports beyond what it pins: the model's own package (a self-import is
never a PyPI package) and guarded imports (inside try/except) that the code goes on to require."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path


def parsed_files(files: Iterable[Path]) -> Iterator[tuple[Path, ast.Module]]:
    """(path, module) of each file that parses (the model's own files; one that does not is skipped)."""
    for path in files:
        try:
            yield path, ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue


def own_package_names(model_dir: Path, files: list[Path]) -> set[str]:
    """Top-level names that are the model's own code: its modules and sub-packages, the folder itself
    (``from <folder>.configuration import ...``, also with '-' and '.' read as '_' the way the loader
    names it) and transformers' dynamic-module package for remote code."""
    folder = model_dir.name
    return ({p.stem for p in files} | {p.name for p in model_dir.iterdir() if p.is_dir()}
            | {folder, re.sub(r"[^\w]", "_", folder), "transformers_modules"})


def _bound_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return [a.asname or a.name for a in node.names if a.name != "*"]


def _top_module(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name.split(".")[0] for a in node.names]
    return [node.module.split(".")[0]] if node.module and not node.level else []


# Other deep-learning frameworks: a guarded import of one serves weight conversion, never the torch model.
OTHER_FRAMEWORKS = frozenset({"tensorflow", "jax", "jaxlib", "flax", "paddle", "mindspore", "keras", "oneflow"})


def _demanded(tree: ast.Module, names: set[str], inside: set[int]) -> bool:
    """Whether the code outside the try demands the names: ``assert rearrange is not None, ...`` or
    ``if rearrange is None: raise ...`` (the check a runtime path makes before it uses them)."""
    def mentions(expr: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))

    for n in ast.walk(tree):
        if id(n) in inside:
            continue
        if isinstance(n, ast.Assert) and mentions(n.test):
            return True
        if isinstance(n, ast.If) and mentions(n.test) and any(isinstance(b, ast.Raise) for b in n.body):
            return True
    return False


def guarded_imports(model_dir: Path, files: list[Path]) -> dict[str, str]:
    """Third-party modules imported inside a ``try:`` that the code outside the try then demands
    (``assert rearrange is not None, 'install einops'``, ``if rearrange is None: raise``): the code
    requires them at run time though the import itself is optional. Other frameworks (tensorflow, jax)
    are left out. {module: "file:line"}."""
    own = own_package_names(model_dir, files) | OTHER_FRAMEWORKS
    found: dict[str, str] = {}
    for path, tree in parsed_files(files):
        for trynode in ast.walk(tree):
            if not isinstance(trynode, ast.Try):
                continue
            inside = {id(n) for n in ast.walk(trynode)}
            for imp in (n for stmt in trynode.body for n in ast.walk(stmt)):
                if not isinstance(imp, ast.Import | ast.ImportFrom):
                    continue
                names = set(_bound_names(imp))
                used = _demanded(tree, names, inside)
                for module in _top_module(imp):
                    if used and module not in sys.stdlib_module_names and module not in own and module not in found:
                        found[module] = f"{path.relative_to(model_dir).as_posix()}:{imp.lineno}"
    return found


# Where a framework's CPU build serves a run as well as the full one (a lighter install), by import name.
LIGHTER_DIST = {"tensorflow": "tensorflow-cpu"}


def function_imports(model_dir: Path, files: list[Path]) -> dict[str, tuple[str, str]]:
    """Third-party modules a function imports in its own body, with no guard around the import
    (``def resize(...): import tensorflow as tf``): the function needs them when it runs, and transformers'
    remote-code loader demands every unguarded import of a file before it loads the file (a processor's
    too). {module: ("file:line", function)}."""
    own = own_package_names(model_dir, files)
    found: dict[str, tuple[str, str]] = {}
    for path, tree in parsed_files(files):
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for stmt in fn.body:
                if not isinstance(stmt, ast.Import | ast.ImportFrom):
                    continue
                for module in _top_module(stmt):
                    if module not in sys.stdlib_module_names and module not in own and module not in found:
                        found[module] = (f"{path.relative_to(model_dir).as_posix()}:{stmt.lineno}", fn.name)
    return found
