"""What the running process can say about a failure that the message alone cannot, read where the live objects
are (the debugger's classes in agents/rules/ turn it into a fix):

- a name missing at run time (NameError; ImportError "cannot import name"; a module without the attribute):
  the modules that provide it here: the failing module's own star imports (an older release's star import
  leaked the name), how the model's other files bind it, typing, a model module defining it, a module of the
  installed transformers defining it, a standard-library module of that name;
- an attribute or a keyword the running release spells differently (AttributeError on an object, TypeError
  "unexpected keyword argument"): the object's class and the close spellings among its attributes, or the
  callee's parameters and the close spellings among them;
- an input the generate path needs (TypeError "missing N required positional arguments" in a model method,
  ValueError "<id> is not in list"): the parameters still required, and the config keys whose value is the id.

Everything here is best effort, bounded, and never raises: a hint is a claim of the model's process, which
the parent validates before a codemod uses it."""

from __future__ import annotations

import ast
import difflib
import inspect
import re
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

MAX_CANDIDATES = 6
SCAN_BUDGET_S = 15.0  # reading the installed transformers for a moved name: a failing run waits this long at most
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_CANNOT_IMPORT = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
_UNEXPECTED_KW = re.compile(r"([\w.<>]+)\(\) got an unexpected keyword argument '(\w+)'")
_MISSING_ARGS = re.compile(r"([\w.<>]+)\(\) missing \d+ required (?:positional|keyword-only) arguments?: (.+)$")
_NOT_IN_LIST = re.compile(r"^(-?\d+) is not in list$")
_MODULE_ATTR = re.compile(r"^module '([\w.]+)' has no attribute '(\w+)'")


def failure_hints(exc: BaseException, model_dir: Path, config: Any = None) -> dict[str, Any]:
    """The hints for this failure ({} when none apply)."""
    try:
        return _hints(exc, model_dir, config)
    except Exception as err:  # noqa: BLE001 - a hint must never hide the failure itself
        return {"error": f"{type(err).__name__}: {str(err)[:120]}"}


def _hints(exc: BaseException, model_dir: Path, config: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    module = _failing_module(exc.__traceback__, model_dir)
    msg = str(exc)
    if isinstance(exc, NameError) and getattr(exc, "name", None):
        out["name"] = exc.name
        out["providers"] = name_providers(exc.name, module, model_dir)
    elif isinstance(exc, ImportError) and (m := _CANNOT_IMPORT.search(msg)):
        out["name"], out["from_module"] = m.group(1), m.group(2)
        out["providers"] = [p for p in name_providers(m.group(1), None, model_dir)
                            if p.get("module") != m.group(2)]
    elif isinstance(exc, AttributeError) and (m := _MODULE_ATTR.search(msg)):
        out["name"], out["from_module"] = m.group(2), m.group(1)
        out["providers"] = [p for p in name_providers(m.group(2), None, model_dir) if p.get("module") != m.group(1)]
    elif isinstance(exc, AttributeError) and getattr(exc, "name", None):
        out.update(attribute_hints(exc))
    elif isinstance(exc, TypeError):
        out.update(call_hints(msg, model_dir))
    elif isinstance(exc, ValueError) and (m := _NOT_IN_LIST.match(msg.strip())):
        out["value"] = int(m.group(1))
        out["config_keys"] = config_keys_with(config if config is not None else _config_json(model_dir),
                                              int(m.group(1)))
    out["release"] = _transformers_version()
    return out


# --- names --------------------------------------------------------------------------------------

def _failing_module(tb: TracebackType | None, model_dir: Path) -> ModuleType | None:
    """The module object of the innermost traceback frame in the model's files."""
    found = None
    root = str(model_dir)
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(root):
            found = tb.tb_frame.f_globals.get("__name__")
        tb = tb.tb_next
    return sys.modules.get(found) if isinstance(found, str) else None


def name_providers(name: str, module: ModuleType | None, model_dir: Path) -> list[dict[str, Any]]:
    """Where ``name`` can be imported from here, most faithful first (see the module docstring)."""
    if not _IDENT.match(name):
        return []
    out: list[dict[str, Any]] = []
    if module is not None:
        out += _star_providers(name, module)
    out += _model_bindings(name, model_dir)
    if hasattr(typing, name):
        out.append({"kind": "typing", "module": "typing", "statement": f"from typing import {name}"})
    out += _model_definitions(name, model_dir)
    if not out:  # reading the installed library costs seconds: only when nothing closer provides the name
        out += _transformers_definitions(name)
    if name in getattr(sys, "stdlib_module_names", ()):
        out.append({"kind": "stdlib", "module": name, "statement": f"import {name}"})
    seen: set[str] = set()
    unique = []
    for p in out:
        if p["statement"] not in seen:
            seen.add(p["statement"])
            unique.append(p)
    return unique[:MAX_CANDIDATES]


def _star_providers(name: str, module: ModuleType) -> list[dict[str, Any]]:
    """The failing module's ``from X import *`` whose module has the name in this release (not exported by
    its ``__all__`` any more, but there: the explicit import works)."""
    path = getattr(module, "__file__", None)
    if not path:
        return []
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    out = []
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)):
            continue
        written = "." * node.level + (node.module or "")
        try:
            absolute = _absolute(written, module)
            mod = sys.modules.get(absolute) or __import__(absolute, fromlist=["_"])
        except Exception:  # noqa: BLE001 - a star import that cannot be resolved provides nothing
            continue
        if name in vars(mod):
            out.append({"kind": "star-import", "module": written, "statement": f"from {written} import {name}"})
    return out


def _absolute(written: str, module: ModuleType) -> str:
    if not written.startswith("."):
        return written
    level = len(written) - len(written.lstrip("."))
    base = (module.__package__ or "").split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    rest = written.lstrip(".")
    return ".".join([*base, rest] if rest else base)


def _model_trees(model_dir: Path) -> Iterator[tuple[Path, ast.Module]]:
    """Each of the model's Python files (the first 200) that parses, with its tree."""
    for path in sorted(p for p in model_dir.rglob("*.py") if "__pycache__" not in p.parts)[:200]:
        try:
            yield path, ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue


def _model_bindings(name: str, model_dir: Path) -> list[dict[str, Any]]:
    """A top-level import in another of the model's files that binds the name: how its authors bound it."""
    out = []
    for _path, tree in _model_trees(model_dir):
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom) and not (isinstance(node, ast.ImportFrom) and node.level):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if bound == name and alias.name != "*":
                        out.append({"kind": "model-import", "module": getattr(node, "module", None) or alias.name,
                                    "statement": _import_text(node, alias)})
    return out[:2]


def _import_text(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    tail = f" as {alias.asname}" if alias.asname else ""
    if isinstance(node, ast.Import):
        return f"import {alias.name}{tail}"
    return f"from {node.module} import {alias.name}{tail}"


def _model_definitions(name: str, model_dir: Path) -> list[dict[str, Any]]:
    """A model file that defines the name at top level (a function, a class, an assignment)."""
    out = []
    for path, tree in _model_trees(model_dir):
        for node in tree.body:
            defined = isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef) and node.name == name
            defined = defined or (isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets))
            if defined:
                rel = path.relative_to(model_dir).with_suffix("")
                out.append({"kind": "model-definition", "module": ".".join(rel.parts), "file": rel.as_posix() + ".py",
                            "statement": ""})  # the parent writes the relative import from the failing file
                break
    return out


def _transformers_definitions(name: str) -> list[dict[str, Any]]:
    """Modules of the installed transformers that define the name at top level (a helper that moved)."""
    try:
        import transformers
    except Exception:  # noqa: BLE001
        return []
    root = Path(transformers.__file__).parent
    pattern = re.compile(rf"^(?:def|class) {re.escape(name)}\b|^{re.escape(name)}\s*[:=]", re.M)
    found: list[tuple[int, str]] = []
    deadline = time.monotonic() + SCAN_BUDGET_S
    # the library's top-level modules first (where helpers move to), then its models
    for path in sorted(root.rglob("*.py"), key=lambda p: (len(p.relative_to(root).parts), str(p))):
        if time.monotonic() > deadline:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if name in text and pattern.search(text):
            rel = path.relative_to(root.parent).with_suffix("")
            mod = ".".join(p for p in rel.parts if p != "__init__")
            found.append((len(rel.parts), mod))
    return [{"kind": "transformers", "module": mod, "statement": f"from {mod} import {name}"}
            for _, mod in sorted(found)[:3]]


# --- attributes and calls -------------------------------------------------------------------------

def attribute_hints(exc: AttributeError) -> dict[str, Any]:
    obj, name = getattr(exc, "obj", None), exc.name
    cls = type(obj)
    attrs = sorted({a for a in dir(obj) if not a.startswith("__")}) if obj is not None else []
    return {"attribute": name, "class": cls.__qualname__, "class_module": cls.__module__,
            "candidates": difflib.get_close_matches(name or "", attrs, n=3, cutoff=0.75),
            "is_none": obj is None}


def call_hints(msg: str, model_dir: Path) -> dict[str, Any]:
    if m := _UNEXPECTED_KW.search(msg):
        fn = _find_callable(m.group(1), model_dir)
        params = _parameters(fn)
        return {"callee": m.group(1), "keyword": m.group(2), "callee_module": getattr(fn, "__module__", ""),
                "callee_file": _relative_file(fn, model_dir), "callee_line": _first_line(fn), "parameters": params[:40],
                "candidates": difflib.get_close_matches(m.group(2), params, n=3, cutoff=0.75)}
    if m := _MISSING_ARGS.search(msg):
        names = re.findall(r"'(\w+)'", m.group(2))
        fn = _find_callable(m.group(1), model_dir)
        return {"callee": m.group(1), "missing": names, "callee_module": getattr(fn, "__module__", ""),
                "callee_file": _relative_file(fn, model_dir)}
    return {}


def _find_callable(qualname: str, model_dir: Path) -> Any:
    """The function a TypeError's message names (``Class.method`` or ``function``), looked up in the model's
    modules first, then transformers'."""
    head, _, tail = qualname.partition(".")
    mods = sorted(((n, m) for n, m in list(sys.modules.items()) if m is not None),
                  key=lambda nm: (not str(getattr(nm[1], "__file__", "") or "").startswith(str(model_dir)),
                                  not nm[0].startswith("transformers")))
    for _, mod in mods[:4000]:
        obj = vars(mod).get(head) if hasattr(mod, "__dict__") else None
        if obj is None or (inspect.isclass(obj) and getattr(obj, "__module__", None) != mod.__name__):
            continue
        for part in tail.split(".") if tail else []:
            obj = getattr(obj, part, None)
        if callable(obj):
            return obj
    return None


def _parameters(fn: Any) -> list[str]:
    try:
        return [p for p in inspect.signature(fn).parameters if p != "self"]
    except (TypeError, ValueError):
        return []


def _first_line(fn: Any) -> int:
    try:
        return int(inspect.getsourcelines(fn)[1])
    except (OSError, TypeError):
        return 0


def _relative_file(fn: Any, model_dir: Path) -> str:
    try:
        path = Path(inspect.getsourcefile(fn) or "")
    except TypeError:
        return ""
    return path.relative_to(model_dir).as_posix() if str(path).startswith(str(model_dir)) else ""


def config_keys_with(config: Any, value: int) -> list[str]:
    """The config keys (any nesting level, dotted) whose value is ``value``: the token a model looks for."""
    if config is None:
        return []
    data = config.to_dict() if hasattr(config, "to_dict") else config if isinstance(config, dict) else {}
    out: list[str] = []

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif v == value and not isinstance(v, bool) and isinstance(v, int):
                out.append(f"{prefix}{k}")

    walk(data, "")
    return out[:MAX_CANDIDATES]


def _config_json(model_dir: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _transformers_version() -> str:
    """The transformers release of this process: the imported module's, else the installed distribution's."""
    mod = sys.modules.get("transformers")
    if mod is not None:
        return str(getattr(mod, "__version__", ""))
    from importlib import metadata

    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return ""
