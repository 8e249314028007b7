"""npuport's inserted helpers (``_npuport_device()``, the CPU stand-ins, the fused-op helpers: agents/rules/kit.py
inserts them after a file's imports) kept out of the user's modeling file: after each fix they move into a module
of their own beside it, ``_npuport_helpers.py``, which the file imports. The diff a reviewer approves then shows
the changes to the model's code, not some hundreds of lines of helpers first (the workspace orders the helper
modules last in every diff), and a line of the model's file keeps its place.

The import works both ways a model file is loaded: as part of a package (transformers' remote-code loader, which
also copies a relatively imported module beside the file; npuport's harness) and as a top-level module."""

from __future__ import annotations

import re

import libcst as cst

HELPER_MODULE = "_npuport_helpers"
HELPER_FILE = f"{HELPER_MODULE}.py"
_HELPER_NAME = re.compile(r"^_?npuport", re.I)
IMPORT_MARK = "# npuport: the helpers npuport inserted live in _npuport_helpers.py beside this file"
_EMPTY = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _defined(stmt: cst.BaseStatement) -> set[str]:
    """Top-level names a statement binds: a def, a class, an assignment, an import, or either branch of a try."""
    if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
        return {stmt.name.value}
    if isinstance(stmt, cst.Try):
        inner = [*stmt.body.body, *(s for h in stmt.handlers for s in h.body.body)]
        return set().union(*(_defined(s) for s in inner if isinstance(s, cst.BaseStatement))) if inner else set()
    names: set[str] = set()
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                names |= {t.target.value for t in small.targets if isinstance(t.target, cst.Name)}
            elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                names.add(small.target.value)
            elif isinstance(small, cst.Import | cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name):
                        names.add(bound.value)
                    elif isinstance(bound, cst.Attribute):  # import a.b binds a
                        names.add(_code(bound).split(".")[0])
    return names


def _used(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class Names(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

    node.visit(Names())
    return found


def _is_helper(stmt: cst.BaseStatement, original: set[str]) -> bool:
    """A statement npuport inserted: not in the original file, and binding only npuport's helper names (or the
    guarded torch_npu import its helper blocks open with)."""
    if _code(stmt).strip() in original:
        return False
    names = _defined(stmt)
    if not names:
        return False
    guarded_npu = isinstance(stmt, cst.Try) and names <= {"torch_npu"}
    return guarded_npu or all(_HELPER_NAME.match(n) for n in names)


def _is_import_block(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.Try) and any(IMPORT_MARK in line.comment.value for line in stmt.leading_lines
                                             if line.comment is not None)


def _import_block(names: list[str]) -> str:
    listed = ", ".join(names)
    if len(listed) > 80:
        listed = "(\n        " + ",\n        ".join(names) + ",\n    )"
    return (f"{IMPORT_MARK}\ntry:\n    from .{HELPER_MODULE} import {listed}  # noqa: F401\n"
            f"except ImportError:  # the file loaded as a top-level module, not from its package\n"
            f"    from {HELPER_MODULE} import {listed}  # noqa: F401\n")


def _is_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(x, cst.Import | cst.ImportFrom)
                                                            for x in stmt.body)


def move_helpers(source: str, original: str, helpers: str | None) -> tuple[str, str | None]:
    """(the file with npuport's helpers replaced by an import of them, the helper module's new text), or the
    file as it is and None when it holds no inserted helper. ``original``: the user's file (what was theirs
    stays); ``helpers``: the helper module beside it as it is (None: none yet)."""
    try:
        module = cst.parse_module(source)
        theirs = {_code(s).strip() for s in cst.parse_module(original).body} if original else set()
        prior = cst.parse_module(helpers) if helpers else None
    except cst.ParserSyntaxError:
        return source, None
    moved = [s for s in module.body if _is_helper(s, theirs)]
    if not moved:
        return source, None
    out = [*moved, *(s for s in module.body if _is_import_block(s))]
    kept = [s for s in module.body if not any(s is m for m in out)]
    helper_text = _helper_text(prior, moved, module)
    bound = {n for s in cst.parse_module(helper_text).body if not _is_import(s) for n in _defined(s)}
    wanted = sorted(bound & _used(module.with_changes(body=kept)))
    first = next(i for i, s in enumerate(module.body) if any(s is m for m in out))
    at = sum(1 for s in module.body[:first] if not any(s is m for m in out))
    block = list(cst.parse_module(_import_block(wanted)).body) if wanted else []
    return _code(module.with_changes(body=[*kept[:at], *block, *kept[at:]])), helper_text


def _helper_text(prior: cst.Module | None, moved: list[cst.BaseStatement], model: cst.Module) -> str:
    """The helper module: a header, the imports its helpers use (the model files' own, torch at least), the helpers
    it had and the ones moved now (a name it defines already is not defined twice)."""
    had = [s for s in (prior.body if prior else []) if not _is_import(s) and _defined(s)]  # not its docstring
    have = {n for s in had for n in _defined(s)}
    helpers = [*had, *(s for s in moved if not _defined(s) <= have)]
    need = set().union(*(_used(s) for s in helpers))
    imports = [_code(s.with_changes(leading_lines=[])).strip() for s in (prior.body if prior else []) if _is_import(s)]
    for s in model.body:
        if not _is_import(s) or not _defined(s) & need:
            continue
        assert isinstance(s, cst.SimpleStatementLine)
        if not any(isinstance(x, cst.ImportFrom) and x.relative for x in s.body):
            imports.append(_code(s.with_changes(leading_lines=[])).strip())
    imports = list(dict.fromkeys(["import torch", *imports]))
    head = ('"""Helpers npuport inserted while porting the model files beside this one (generated; the model\'s own '
            'code\nimports them from here)."""\n\n')
    body = "\n\n".join(_code(_without_leading_blanks(s)) for s in helpers)
    return head + "\n".join(imports) + "\n\n\n" + body


def _without_leading_blanks(stmt: cst.BaseStatement) -> cst.BaseStatement:
    """The statement without the blank lines above it (its comments kept): the module is written with two blank
    lines between helpers, so writing it again from its own text gives the same text (a fix that adds no helper
    leaves the helper module out of its commit)."""
    lines = list(stmt.leading_lines)
    while lines and lines[0].comment is None:
        lines.pop(0)
    return stmt.with_changes(leading_lines=lines)
