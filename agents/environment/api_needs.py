"""What a model's code needs from transformers, read from its files (``ast``; never run): every module it
imports, every name it imports from one, every attribute it reads of a transformers module or class, and
the members its classes take from the transformers classes they derive from.

- ``import transformers.cache_utils`` / ``from transformers.cache_utils import DynamicCache``;
- ``transformers.generation.utils.GenerationMixin``, ``PreTrainedModel._supports_sdpa``,
  ``GenerationMixin._extract_past_from_model_output(self, ...)``: attribute chains on a name an import bound
  to a transformers module or class;
- ``super().generate(...)`` in a class derived (directly or through the model's own classes) from a
  transformers class, and ``self.m(...)`` there for an ``m`` the model's code never defines nor assigns and
  torch's ``Module`` does not give: a member one of those transformers bases must have;
- ``logger.warning_once(...)`` on a logger from transformers' ``get_logger``: an attribute the release adds
  to the standard library's ``Logger``.

What is read under a guard is no need: the body of a ``try`` whose handlers catch an ImportError or an
AttributeError (or any Exception), and an ``if`` that tests ``hasattr``/``getattr``, a version, an
``is_..._available()`` or ``TYPE_CHECKING``. ``self.config.x`` is the model's config, not transformers.
"""

from __future__ import annotations

import ast
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agents.environment.imports import parsed_files
from agents.environment.pins import model_py_files

ROOT = "transformers"
_CATCHING = frozenset({"ImportError", "ModuleNotFoundError", "AttributeError", "Exception", "BaseException",
                       "NameError", "TypeError", "RuntimeError"})
_FEATURE_TESTS = ("hasattr", "getattr", "version", "available", "TYPE_CHECKING")


@dataclass(frozen=True)
class Need:
    """One thing the code reads from transformers: any one of ``paths`` resolving in a release satisfies it
    (a member a class may take from any of its transformers bases)."""

    paths: tuple[str, ...]
    where: str  # "modeling_x.py:12"
    how: str  # import | attribute | super() | inherited call | logger

    @property
    def shown(self) -> str:
        return f"{self.paths[0]} ({self.where})"


@functools.lru_cache(maxsize=1)
def _given() -> frozenset[str]:
    """Members the model's classes have without transformers: torch's Module (and object's), Logger's own."""
    names = set(dir(object)) | {n for n in dir(logging.Logger) if not n.startswith("__")}
    try:
        import torch.nn

        names |= set(dir(torch.nn.Module))
    except ImportError:
        names |= {"forward", "to", "cuda", "cpu", "eval", "train", "parameters", "modules", "apply"}
    return frozenset(names)


def _catches_lookups(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        if any(isinstance(k, ast.Name | ast.Attribute) and (k.id if isinstance(k, ast.Name) else k.attr) in _CATCHING
               for k in kinds):
            return True
    return False


def _feature_test(test: ast.expr) -> bool:
    text = ast.unparse(test)
    return any(word in text for word in _FEATURE_TESTS)


def _walk(node: ast.AST, guarded: bool = False, cls: str | None = None) -> Iterator[tuple[ast.AST, bool, str | None]]:
    """Every node with whether a guard holds it and the class whose body (or method) it is in."""
    yield node, guarded, cls
    if isinstance(node, ast.Try):
        inner = guarded or _catches_lookups(node)
        for child in node.body:
            yield from _walk(child, inner, cls)
        for child in [*node.handlers, *node.orelse, *node.finalbody]:
            yield from _walk(child, guarded, cls)
        return
    if isinstance(node, ast.If):
        inner = guarded or _feature_test(node.test)
        yield from _walk(node.test, guarded, cls)
        for child in [*node.body, *node.orelse]:
            yield from _walk(child, inner, cls)
        return
    if isinstance(node, ast.ClassDef):
        cls = node.name
    for child in ast.iter_child_nodes(node):
        yield from _walk(child, guarded, cls)


def _dotted(expr: ast.expr) -> tuple[str, list[str]] | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return (expr.id, list(reversed(parts))) if isinstance(expr, ast.Name) else None


@dataclass
class _File:
    path: Path
    rel: str
    tree: ast.Module
    bound: dict[str, str] = field(default_factory=dict)  # name -> transformers path (unguarded imports)
    loggers: set[str] = field(default_factory=set)


@dataclass
class _Code:
    """What the model's files define: their own names, their classes' bases and methods."""

    files: list[_File]
    own: set[str] = field(default_factory=set)  # every def/class name and every attribute it assigns
    bases: dict[str, list[str]] = field(default_factory=dict)  # class -> transformers paths and own class names
    methods: dict[str, set[str]] = field(default_factory=dict)

    def transformers_bases(self, cls: str, seen: frozenset[str] = frozenset()) -> list[str]:
        out: list[str] = []
        for base in self.bases.get(cls, []):
            if base.startswith(f"{ROOT}."):
                out.append(base)
            elif base in self.bases and base not in seen:
                out += self.transformers_bases(base, seen | {cls})
        return list(dict.fromkeys(out))

    def own_ancestors_define(self, cls: str, name: str, seen: frozenset[str] = frozenset()) -> bool:
        for base in self.bases.get(cls, []):
            if base in self.bases and base not in seen and (
                    name in self.methods.get(base, set()) or self.own_ancestors_define(base, name, seen | {cls})):
                return True
        return False


def _bind(f: _File, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(name bound, transformers path) of one import; the paths it imports (for the needs)."""
    pairs: list[tuple[str, str]] = []
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name.split(".")[0] == ROOT:
                pairs.append((a.asname or ROOT, a.name if a.asname else ROOT))
    elif node.module and not node.level and node.module.split(".")[0] == ROOT:
        pairs += [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]
    return pairs


def _read(model_dir: Path) -> _Code:
    files = [_File(p, p.relative_to(model_dir).as_posix(), t) for p, t in parsed_files(model_py_files(model_dir))]
    code = _Code(files)
    for f in files:
        for node, guarded, _ in _walk(f.tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and not guarded:
                f.bound.update(_bind(f, node))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                code.own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                code.own.add(node.attr)
        for node in f.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                callee = _dotted(node.value.func)
                if callee and callee[0] in f.bound and (callee[1] or [callee[0]])[-1] == "get_logger":
                    f.loggers.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for f in files:
        for node in ast.walk(f.tree):
            if isinstance(node, ast.ClassDef):
                code.methods[node.name] = {n.name for n in node.body
                                           if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                code.bases[node.name] = [b for b in (_base_path(f, e) for e in node.bases) if b]
    return code


def _base_path(f: _File, expr: ast.expr) -> str | None:
    dotted = _dotted(expr)
    if dotted is None:
        return None
    head, rest = dotted
    if head in f.bound:
        return ".".join([f.bound[head], *rest])
    return head if not rest else None


def _attribute_needs(f: _File, values: set[int]) -> Iterator[Need]:
    for node, guarded, _ in _walk(f.tree):
        if guarded or not isinstance(node, ast.Attribute) or id(node) in values or not isinstance(node.ctx, ast.Load):
            continue
        dotted = _dotted(node)
        if dotted and dotted[0] in f.bound:
            yield Need((".".join([f.bound[dotted[0]], *dotted[1]]),), f"{f.rel}:{node.lineno}", "attribute")


def _import_needs(f: _File) -> Iterator[Need]:
    for node, guarded, _ in _walk(f.tree):
        if guarded:
            continue
        where = f"{f.rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            yield from (Need((a.name,), where, "import") for a in node.names
                        if a.name.split(".")[0] == ROOT and a.name != ROOT)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module.split(".")[0] == ROOT:
            yield from (Need((node.module if a.name == "*" else f"{node.module}.{a.name}",), where, "import")
                        for a in node.names)


def _inherited_needs(code: _Code, f: _File, given: frozenset[str], calls: set[int]) -> Iterator[Need]:
    for node, guarded, cls in _walk(f.tree):
        if guarded or not isinstance(node, ast.Attribute) or node.attr.startswith("__") or node.attr in given:
            continue
        where = f"{f.rel}:{node.lineno}"
        value = node.value
        if isinstance(value, ast.Name) and value.id in f.loggers and node.attr not in dir(logging.Logger):
            yield Need((f"logging.Logger.{node.attr}",), where, "logger")
            continue
        bases = code.transformers_bases(cls) if cls else []
        if not bases:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
            if not code.own_ancestors_define(cls or "", node.attr):
                yield Need(tuple(f"{b}.{node.attr}" for b in bases), where, "super()")
        elif isinstance(value, ast.Name) and value.id == "self" and node.attr not in code.own and id(node) in calls:
            # called only: an attribute merely read may be set where the code cannot tell (setattr, the config)
            yield Need(tuple(f"{b}.{node.attr}" for b in bases), where, "inherited call")


def code_needs(model_dir: Path) -> list[Need]:
    """Everything the model's code reads from transformers, once each (first place it is read)."""
    code = _read(model_dir)
    given = _given()
    found: dict[tuple[str, ...], Need] = {}
    for f in code.files:
        values = {id(n.value) for n in ast.walk(f.tree) if isinstance(n, ast.Attribute)}
        calls = {id(n.func) for n in ast.walk(f.tree) if isinstance(n, ast.Call)}
        for need in [*_import_needs(f), *_attribute_needs(f, values), *_inherited_needs(code, f, given, calls)]:
            found.setdefault(need.paths, need)
    return list(found.values())


def transformers_paths_of(model_dir: Path, name: str) -> list[str]:
    """The transformers classes an object named ``name`` in an error takes its members from: the
    transformers bases of the model's class of that name, or the transformers class an import bound to it."""
    code = _read(model_dir)
    if name in code.bases:
        return code.transformers_bases(name)
    return list(dict.fromkeys(f.bound[name] for f in code.files if name in f.bound))
