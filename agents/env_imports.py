"""What the model's code imports beyond what it pins: the model's own package (a self-import is
never a PyPI package) and guarded imports (inside try/except) that the code goes on to require."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path


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


def guarded_imports(model_dir: Path, files: list[Path]) -> dict[str, str]:
    """Third-party modules imported inside a ``try:`` whose bound names the same file uses outside that
    try statement (``rearrange(...)``, ``assert rearrange is not None, 'install einops'``): the code
    requires them at run time even though the import itself is optional. {module: "file:line"}."""
    own = own_package_names(model_dir, files)
    found: dict[str, str] = {}
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for trynode in ast.walk(tree):
            if not isinstance(trynode, ast.Try):
                continue
            inside = {id(n) for n in ast.walk(trynode)}
            for imp in (n for stmt in trynode.body for n in ast.walk(stmt)):
                if not isinstance(imp, ast.Import | ast.ImportFrom):
                    continue
                names = set(_bound_names(imp))
                used = any(isinstance(n, ast.Name) and n.id in names and id(n) not in inside
                           for n in ast.walk(tree))
                for module in _top_module(imp):
                    if used and module not in sys.stdlib_module_names and module not in own and module not in found:
                        found[module] = f"{path.relative_to(model_dir).as_posix()}:{imp.lineno}"
    return found
