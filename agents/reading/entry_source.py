"""Reading a model's source for its entry (agents/entry.py): the Python files, config.json, auto_map
references, and the classes of a module and its relative imports, parsed with ``ast`` (never imported:
model code may need CUDA or be hostile)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from knowledge.errors import EntryNotFound, ManifestError

MANIFEST_NAME = "npuport.yaml"
MODULE_BASES = {"Module", "PreTrainedModel", "GenerationMixin"}
SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "env", "node_modules", "site-packages", "tests", "test"}
# auto_map keys tried in order; the first the config names wins.
AUTO_MAP_PREFERENCE = ("AutoModelForCausalLM", "AutoModelForVision2Seq", "AutoModelForImageTextToText",
                       "AutoModelForSeq2SeqLM", "AutoModel")
NOT_MODEL_AUTO_KEYS = ("AutoConfig", "AutoTokenizer", "AutoProcessor", "AutoImageProcessor",
                       "AutoFeatureExtractor", "AutoVideoProcessor")


def _python_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            continue
        if rel[-1].startswith("test_") or rel[-1] in ("conftest.py", "setup.py"):
            continue
        out.append(p)
    return out


def _read_config(path: Path, root: Path | None = None) -> dict[str, Any]:
    """The JSON object of a config file; with ``root``, the path must resolve inside it (a link out of the
    model's folder is refused: knowledge/untrusted.py)."""
    from knowledge.errors import UntrustedValue
    from knowledge.untrusted import MAX_CONFIG_BYTES, inside, read_json_object

    try:
        real = inside(root, path.relative_to(root).as_posix(), path.name) if root is not None else path.resolve()
        if not real.is_file():
            raise EntryNotFound(f"{path.name} is not a file")
        return read_json_object(real, MAX_CONFIG_BYTES, path.name)
    except UntrustedValue as exc:
        raise EntryNotFound(str(exc)) from exc


def _auto_map_key(auto: dict[str, Any]) -> str | None:
    for key in AUTO_MAP_PREFERENCE:
        if auto.get(key):
            return key
    return next((k for k, v in auto.items() if k.startswith("AutoModel") and v and k not in NOT_MODEL_AUTO_KEYS),
                None)


def _split_auto_ref(value: Any, key: str) -> tuple[str, str]:
    """'modeling_x.Class' (or 'user/repo--modeling_x.Class', or a list of such) -> (module, class)."""
    if isinstance(value, list | tuple):
        value = next((v for v in value if v), None)
    if not isinstance(value, str) or "." not in value:
        raise EntryNotFound(f"config.json auto_map[{key!r}] should be 'module.Class', got {value!r}")
    value = value.split("--", 1)[-1]
    module, _, cls = value.rpartition(".")
    return module, cls


def _module_file(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parse(path: Path, root: Path) -> ast.Module:
    rel = path.relative_to(root).as_posix()
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    except SyntaxError as exc:
        raise EntryNotFound(f"syntax error in the model: {rel}:{exc.lineno}: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise EntryNotFound(f"{rel} is not UTF-8 text") from exc


def _check_class(root: Path, module: str, cls: str, *, field: str, manifest: bool = True) -> str:
    """The module file (posix, relative) after checking it defines or imports cls."""
    prefix = f"{MANIFEST_NAME}: {field}" if manifest else field
    path = _module_file(root, module)
    if path is None:
        raise (ManifestError if manifest else EntryNotFound)(f"{prefix}: no module {module} "
                                                             f"({module.replace('.', '/')}.py) under the model root")
    tree = _parse(path, root)
    rel = path.relative_to(root).as_posix()
    if cls not in _top_level_names(tree):
        raise (ManifestError if manifest else EntryNotFound)(f"{prefix}: {rel} has no class {cls}")
    return rel


def _check_function(root: Path, module: str, fn: str, *, field: str) -> None:
    path = _module_file(root, module)
    if path is None:
        raise ManifestError(f"{MANIFEST_NAME}: {field}: no module {module} ({module.replace('.', '/')}.py)")
    if fn not in _top_level_names(_parse(path, root)):
        raise ManifestError(f"{MANIFEST_NAME}: {field}: {path.relative_to(root).as_posix()} has no function {fn}")


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines or imports at top level (classes, functions, assignments)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _package_classes(root: Path, tree: ast.Module, module_file: str) -> dict[str, ast.ClassDef]:
    """Top-level classes of a module and of the modules it imports relatively (``from .x import Base``),
    transitively: a remote-code model's bases often live in a sibling module."""
    classes: dict[str, ast.ClassDef] = {}
    seen: set[str] = set()
    todo: list[tuple[ast.Module, str]] = [(tree, module_file)]
    while todo:
        mod_tree, rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for node in mod_tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                path = _module_file(root, node.module)
                if path is not None and path.relative_to(root).as_posix() not in seen:
                    try:
                        todo.append((_parse(path, root), path.relative_to(root).as_posix()))
                    except EntryNotFound:
                        continue
    return classes


def _local_hierarchy(classes: dict[str, ast.ClassDef], cls: str) -> Iterator[tuple[str, ast.ClassDef]]:
    """``cls`` and its base classes defined in the model's own files (each once), nearest first."""
    seen: set[str] = set()
    todo = [cls]
    while todo:
        name = todo.pop().rsplit(".", 1)[-1]
        node = classes.get(name)
        if node is None or name in seen:
            continue
        seen.add(name)
        yield name, node
        todo += [_base_name(b) for b in reversed(node.bases)]


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_base_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return ""


class _ClassInfo(BaseModel):
    name: str
    file: str
    bases: list[str]
    has_forward: bool
    has_generate: bool
    size: int
    names_used: set[str]


def _module_classes(trees: dict[Path, ast.Module], root: Path) -> dict[str, _ClassInfo]:
    """Top-level classes that are nn.Modules (directly or through a local base) and have a forward."""
    infos: dict[str, _ClassInfo] = {}
    for path, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {b.name for b in node.body if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)}
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
                   {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            infos[node.name] = _ClassInfo(name=node.name, file=path.relative_to(root).as_posix(),
                                          bases=[_base_name(b) for b in node.bases],
                                          has_forward="forward" in methods, has_generate="generate" in methods,
                                          size=(node.end_lineno or node.lineno) - node.lineno, names_used=used)

    def is_module(c: _ClassInfo, seen: frozenset[str] = frozenset()) -> bool:
        for b in c.bases:
            last = b.rsplit(".", 1)[-1]
            if last in MODULE_BASES or last.endswith("PreTrainedModel"):
                return True
            local = infos.get(last)
            if local is not None and last not in seen and is_module(local, seen | {c.name}):
                return True
        return False

    def has(c: _ClassInfo, attr: str, seen: frozenset[str] = frozenset()) -> bool:
        if getattr(c, attr):
            return True
        return any(b.rsplit(".", 1)[-1] in infos and b not in seen and has(infos[b.rsplit(".", 1)[-1]], attr,
                                                                            seen | {c.name}) for b in c.bases)

    out = {}
    for name, c in infos.items():
        if is_module(c) and has(c, "has_forward"):
            out[name] = c.model_copy(update={"has_generate": has(c, "has_generate")})
    return out
