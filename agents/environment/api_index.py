"""The public API of a transformers release, read from its wheel as files (``ast``, never imported).

Which release can run a model's code is a question about names: the modules it imports, the names it
imports from them, the attributes it reads of transformers' modules and classes. Each release answers it
through an index built once from its wheel and kept as JSON beside the wheel cache
(``<NPUPORT_WHEEL_CACHE>/transformers-api/<version>.json``):

- every module and package (the wheel's file names), and the deprecated module paths a package serves as
  another (a dict of module names onto module names in its ``__init__``);
- for each module read: its top-level names and where each comes from (defined there, or imported: the
  origin's dotted path), its star imports, the names a lazy package lists in its import structure
  (``_import_structure = {"cache_utils": ["Cache", ...]}``), and every class's bases (resolved to dotted
  paths) and members (methods, class attributes, ``self.x = ...`` in its methods; ``*`` when it sets
  attributes by computed names or defines ``__getattr__``: then any member is taken as there);
- ``__all__`` of every module (read from the text: cheap), which star imports expand to;
- attributes the release sets on classes outside it when imported (``logging.Logger.warning_once = ...``).

Every module outside ``transformers/models/`` and every package ``__init__`` is read when the index is
built (seconds); a model's module (``models/llama/modeling_llama.py``) only when a question needs it, and
then kept in the index. ``ReleaseAPI.provides("transformers.cache_utils.DynamicCache.from_legacy_cache")``
answers whether a dotted path resolves in the release.
"""

from __future__ import annotations

import ast
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 3
ROOT = "transformers"
# A class whose members are not all in its source (it sets attributes by computed names, or defines
# __getattr__): any member read of it is taken as there.
OPEN = "*"
_ALL = re.compile(rb"^__all__\s*=\s*([\[(].*?[\])])\s*$", re.M | re.S)
_IDENT = re.compile(r"^[A-Za-z_][\w.]*$")


@dataclass
class ModuleAPI:
    """What one module of a release defines and re-exports."""

    names: dict[str, str] = field(default_factory=dict)  # name -> origin ("" when defined here)
    stars: list[str] = field(default_factory=list)  # modules it star-imports
    classes: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # name -> {"bases", "members"}
    patched: list[str] = field(default_factory=list)  # outside attributes it sets ("logging.Logger.warning_once")
    aliases: dict[str, str] = field(default_factory=dict)  # module path -> the module it is served as
    all: list[str] | None = None


def _dotted(expr: ast.expr) -> str | None:
    """``a.b.c`` of a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return ".".join([expr.id, *reversed(parts)])


def _absolute(package: str, level: int, module: str | None) -> str:
    """The absolute module of ``from <level dots><module> import``, inside ``package``."""
    base = package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def _top_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, also those in every branch of a top-level if / try / with (an import under
    ``if TYPE_CHECKING:`` or in a ``try`` still names what the module offers)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _top_statements(node.body) + _top_statements(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_statements(node.body) + _top_statements(node.orelse) + _top_statements(node.finalbody)
            for handler in node.handlers:
                out += _top_statements(handler.body)
        elif isinstance(node, ast.With):
            out += _top_statements(node.body)
    return out


def _strings(expr: ast.expr | None) -> list[str]:
    if isinstance(expr, ast.List | ast.Tuple | ast.Set):
        return [e.value for e in expr.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    return []


def _bind_import(node: ast.Import | ast.ImportFrom, package: str, api: ModuleAPI) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.asname:
                api.names[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                api.names[top] = top
        return
    source = _absolute(package, node.level, node.module) if node.level else (node.module or "")
    for a in node.names:
        if a.name == "*":
            api.stars.append(source)
        else:
            api.names[a.asname or a.name] = f"{source}.{a.name}"


def _lazy_structure(node: ast.stmt, package: str, api: ModuleAPI, structures: set[str]) -> None:
    """``_import_structure = {"sub": ["Name"]}``, ``_import_structure["sub"] = [...]`` / ``.extend([...])`` /
    ``.append("...")``: names a lazy package offers from its submodules."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and len(node.targets) == 1 \
            and isinstance(node.targets[0], ast.Name):
        keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        if keys and len(keys) == len(node.value.keys):
            if all(isinstance(v, ast.List | ast.Tuple | ast.Set) for v in node.value.values):
                structures.add(node.targets[0].id)
                for key, value in zip(keys, node.value.values, strict=True):
                    for name in _strings(value):
                        api.names.setdefault(name, f"{package}.{key}.{name}")
            elif all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in node.value.values):
                for key, value in zip(keys, node.value.values, strict=True):
                    if _IDENT.match(key) and isinstance(value, ast.Constant) and _IDENT.match(str(value.value)):
                        api.aliases[f"{package}.{key}"] = f"{package}.{value.value}"
        return
    target, value = None, None
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func,
                                                                                        ast.Attribute) \
            and node.value.func.attr in ("extend", "append") and node.value.args:
        target, value = node.value.func.value, node.value.args[0]
    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in structures \
            and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str):
        for name in _strings(value):
            api.names.setdefault(name, f"{package}.{target.slice.value}.{name}")


def _class_record(node: ast.ClassDef, module: str, api: ModuleAPI) -> dict[str, list[str]]:
    bases = []
    for base in node.bases:
        path = _dotted(base)
        if path is None:
            continue
        head, _, rest = path.partition(".")
        origin = api.names.get(head)
        root = f"{module}.{head}" if origin == "" else origin or f"builtins.{head}"
        bases.append(f"{root}.{rest}" if rest else root)
    members: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            members.add(item.name)
        elif isinstance(item, ast.Assign):
            members.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target] if isinstance(sub, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                members.add(t.attr)
        if _sets_by_name(sub):
            members.add(OPEN)
    if members & {"__getattr__", "__getattribute__"}:
        members.add(OPEN)
    return {"bases": bases, "members": sorted(members)}


def _sets_by_name(node: ast.AST) -> bool:
    """``setattr(self, name, value)`` with a name computed at run time (a processor's ``attributes`` list): the
    class's members cannot all be read from its source."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
        and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls") \
        and not isinstance(node.args[1], ast.Constant)


def parse_module(module: str, is_package: bool, source: bytes) -> ModuleAPI:
    """The API of one module of the release, from its source (never run)."""
    api = ModuleAPI()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return api
    package = module if is_package else module.rpartition(".")[0]
    statements = _top_statements(tree.body)
    structures: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import | ast.ImportFrom):
            _bind_import(node, package, api)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            api.names[node.name] = ""
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        api.names[n.id] = ""
            if is_package:
                _lazy_structure(node, package, api, structures)
        elif is_package and isinstance(node, ast.Expr):
            _lazy_structure(node, package, api, structures)
        if isinstance(node, ast.Assign) and node.targets and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == "__all__":
            api.all = _strings(node.value) or api.all
    for node in statements:
        if isinstance(node, ast.ClassDef):
            api.classes[node.name] = _class_record(node, module, api)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
            path = _dotted(node.targets[0])
            head = (path or "").split(".")[0]
            origin = api.names.get(head)
            if path and origin and not origin.startswith(ROOT) and path.count(".") >= 2:
                api.patched.append(f"{origin}{path[len(head):]}")  # `logging.Logger.warning_once = ...`
            elif path and origin == "" and path.count(".") == 1 and head in api.classes:
                api.classes[head]["members"].append(path.split(".")[1])  # `PreTrainedModel.push_to_hub = ...`
    return api


def _exports(source: bytes) -> list[str] | None:
    """``__all__`` read from the text (a literal list or tuple), without parsing the module."""
    m = _ALL.search(source)
    if m is None:
        return None
    try:
        value = ast.literal_eval(m.group(1).decode("utf-8", errors="replace"))
    except (ValueError, SyntaxError):
        return None
    return [v for v in value if isinstance(v, str)] if isinstance(value, list | tuple) else None


class SourceTree:
    """The release's files: a wheel (zip) or an installed package folder (its parent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._zip = zipfile.ZipFile(path) if path.is_file() else None

    def python_files(self) -> list[str]:
        """Paths like ``transformers/cache_utils.py`` (posix, relative to the package's parent)."""
        if self._zip is not None:
            return [n for n in self._zip.namelist() if n.startswith(f"{ROOT}/") and n.endswith(".py")
                    and ".." not in n.split("/")]
        base = self.path
        return sorted(p.relative_to(base).as_posix() for p in (base / ROOT).rglob("*.py")
                      if "__pycache__" not in p.parts)

    def read(self, rel: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(rel)
        return (self.path / rel).read_bytes()

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def module_of(rel: str) -> tuple[str, bool]:
    """(dotted module, is a package) of ``transformers/a/b.py`` / ``transformers/a/__init__.py``."""
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _eager(rel: str) -> bool:
    """Read when the index is built: everything but a model's own modules (read when asked)."""
    return not rel.startswith(f"{ROOT}/models/") or rel.endswith("/__init__.py")


def build_index(version: str, tree: SourceTree, source_name: str) -> dict[str, Any]:
    """The index of a release as plain JSON (see the module's docstring)."""
    files = tree.python_files()
    modules: dict[str, str] = {}
    packages: list[str] = []
    exports: dict[str, list[str]] = {}
    parsed: dict[str, Any] = {}
    for rel in files:
        module, is_package = module_of(rel)
        modules[module] = rel
        if is_package:
            packages.append(module)
        source = tree.read(rel)
        if _eager(rel):
            api = parse_module(module, is_package, source)
            parsed[module] = api_json(api)
            if api.all is not None:
                exports[module] = api.all
        elif (found := _exports(source)) is not None:
            exports[module] = found
    aliases = {a: t for m in parsed.values() for a, t in m["aliases"].items() if t in modules and a not in modules}
    return {"schema": SCHEMA, "version": version, "source": source_name, "modules": modules,
            "packages": sorted(packages), "exports": exports, "parsed": parsed, "aliases": aliases,
            "patched": sorted({p for m in parsed.values() for p in m["patched"]})}


def api_json(api: ModuleAPI) -> dict[str, Any]:
    return {"names": api.names, "stars": api.stars, "classes": api.classes, "patched": api.patched,
            "aliases": api.aliases}


def write_json(path: Path, doc: Any) -> None:
    """Written whole or not at all (another port may be reading it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    tmp.replace(path)
