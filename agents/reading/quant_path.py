"""Quantized checkpoints (hazard H23, the run side): which path of the model's own code a port builds and
validates when the release ships quantized weights whose kernels are CUDA-only.

A quantized remote-code release builds its quantized layers in its constructor, in one of two ways:

- a quantizing subclass: the entry class derives from a complete float model class of the same code and
  its own ``__init__`` swaps the layers (``quantize_offline(self)``, ``bnb.nn.Linear4bit``, an import of a
  CUDA-only quantization library). Its float base is the path the code offers without the kernels: the
  port builds that class (the same modules, weights and forward, minus the swap);
- a quantization switch in the config: a constructor quantizes under a test of a config value
  (``if config.wbits in [4, 8]: self.quantize(...)``, ``if self.config.quantization_bit: ...``) that
  config.json turns on. The port runs with the value that turns it off, taken from the values the code
  itself accepts for that key (``wbits`` not in ``[4, 8, 32]`` warns: 32), else a falsy value.

Either way the reference and the port build the same float path with the same random weights, so the
validation is honest about what it covers: the model's float computation on the target, not the int
kernels; the report says so and names the Ascend recipe for the quantized weights. A checkpoint whose
quantization lives only in its files (config.json's ``quantization_config``, AutoGPTQ's
``quantize_config.json``) builds float layers from the config anyway; it gets the same label.

Nothing here runs model code: it reads the AST (the entry reader, agents/entry.py, passes the classes).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.cuda_redirect.cuda_only import LIBRARIES

# A call that builds quantized layers: quantize(...), quantize_offline(self), make_quant(...),
# replace_with_bnb_linear(...); never dequantize.
_QUANT_CALL = re.compile(r"quanti[sz]e|make_quant|replace_with_\w*(bnb|gptq|awq|quant)", re.I)
# CUDA-only quantization libraries (bitsandbytes, auto_gptq, awq, exllamav2): what sandbox/cuda_redirect/cuda_only.py's
# table says is quantisation or is replaced by Ascend quantisation.
_QUANT_LIBS = tuple(lib.module for lib in LIBRARIES if "quantis" in f"{lib.what} {lib.instead}".lower())
_KERNEL_LIBS = tuple(lib.module for lib in LIBRARIES)
ASCEND_RECIPE = ("on Ascend the quantized weights run through torch_npu.npu_weight_quant_batchmatmul (int8 / int4 "
                 "weights with per-channel or per-group antiquant scales and offsets, float16 / bfloat16 "
                 "activations), or as an msModelSlim W8A8 / W4A8 export served by vLLM-Ascend (recipe H23)")
_FALSY: tuple[Any, ...] = (0, None, False)


@dataclass
class QuantPath:
    """The float path a port of a quantized release builds, and why."""

    scheme: str  # what the release quantizes with, in words
    sites: list[str]  # "file:line" of the quantizing code or config
    entry_class: str  # the class config.json names
    float_class: str | None = None  # a local float base to build instead
    overrides: dict[str, Any] = field(default_factory=dict)  # config values that switch quantization off

    @property
    def validated(self) -> str:
        """What a validation of this port covers, in plain words."""
        if self.float_class:
            path = (f"the float path the code offers: {self.float_class}, the class {self.entry_class} derives from "
                    "without its quantizing constructor")
        elif self.overrides:
            shown = ", ".join(f"{k}={v!r}" for k, v in self.overrides.items())
            path = (f"the float path the code offers: {self.entry_class} built with {shown}, which skips the "
                    "quantization")
        else:
            path = (f"the float layers {self.entry_class} builds from config.json (the checkpoint's quantization "
                    "is data)")
        return (f"{path}; random weights, the same in the reference and the port. The quantized kernels "
                f"({self.scheme}) were not run or validated")

    def assumption(self) -> str:
        return (f"quantized checkpoint ({self.scheme}, {', '.join(self.sites[:3])}): the port validates "
                f"{self.validated}; {ASCEND_RECIPE}")

    def as_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "sites": self.sites, "entry_class": self.entry_class,
                "float_class": self.float_class, "overrides": self.overrides, "validated": self.validated,
                "ascend": ASCEND_RECIPE}


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _is_quant_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and bool(_QUANT_CALL.search(_callee(node))) and \
        not _callee(node).lower().startswith("dequant")


def _imports_of(node: ast.AST) -> list[str]:
    out: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            out += [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            out.append(n.module)
    return out


def _lib_of(module: str, libs: tuple[str, ...]) -> str | None:
    return next((lib for lib in libs if module == lib or module.startswith(lib + ".")), None)


def _init(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)


def _walk_own(fn: ast.AST) -> list[ast.AST]:
    """Nodes of a function body, not those of functions or classes defined inside it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        n = todo.pop()
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        out.append(n)
        todo += list(ast.iter_child_nodes(n))
    return out


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


# ---------------------------------------------------------------------------------------------
# The config switch: evaluate a constructor's test of a config value
# ---------------------------------------------------------------------------------------------

_UNKNOWN = object()


def _config_key(node: ast.AST) -> str | None:
    """``config.KEY``, ``self.config.KEY``, ``getattr(config, "KEY", ...)``: KEY."""
    if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id == "config") or
            (isinstance(node.value, ast.Attribute) and node.value.attr == "config")):
        return node.attr
    if isinstance(node, ast.Call) and _callee(node) == "getattr" and len(node.args) >= 2 and \
            _config_key(ast.Attribute(value=node.args[0], attr="x")) and isinstance(node.args[1], ast.Constant) and \
            isinstance(node.args[1].value, str):
        return node.args[1].value
    return None


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _evaluate(test: ast.AST, key: str, value: Any) -> Any:
    """The test's truth with config.KEY = value; _UNKNOWN where it reads anything else."""
    if _config_key(test) == key:
        return bool(value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _evaluate(test.operand, key, value)
        return _UNKNOWN if inner is _UNKNOWN else not inner
    if isinstance(test, ast.BoolOp):
        parts = [_evaluate(v, key, value) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in parts else _UNKNOWN if _UNKNOWN in parts else True
        return True if True in parts else _UNKNOWN if _UNKNOWN in parts else False
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and _config_key(test.left) == key:
        other = _literal(test.comparators[0])
        if other is _UNKNOWN:
            return _UNKNOWN
        op = test.ops[0]
        try:
            if isinstance(op, ast.In | ast.NotIn):
                inside = value in other
                return inside if isinstance(op, ast.In) else not inside
            if isinstance(op, ast.Is | ast.IsNot):
                same = value is other
                return same if isinstance(op, ast.Is) else not same
            compare = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Gt: lambda a, b: a > b,
                       ast.GtE: lambda a, b: a >= b, ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b}
            fn = compare.get(type(op))
            return fn(value, other) if fn else _UNKNOWN  # type: ignore[no-untyped-call]
        except TypeError:
            return False if isinstance(op, ast.Gt | ast.GtE | ast.Lt | ast.LtE) else _UNKNOWN
    return _UNKNOWN


def _keys_of(test: ast.AST) -> set[str]:
    return {k for n in ast.walk(test) if (k := _config_key(n))}


def _literals_for(trees: list[ast.Module], key: str) -> list[Any]:
    """Values the code compares config.KEY with (``in [4, 8, 32]``, ``== 16``), in code order."""
    out: list[Any] = []
    for tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, ast.Compare) and len(n.ops) == 1 and _config_key(n.left) == key:
                lit = _literal(n.comparators[0])
                values = list(lit) if isinstance(lit, list | tuple | set | frozenset) else [lit]
                out += [v for v in values if v is not _UNKNOWN and isinstance(v, int | float | str | bool)
                        and v not in out]
    return out


def _switches(trees: dict[str, ast.Module]) -> list[tuple[str, ast.If, str]]:
    """(key, if-node, "file:line") for each constructor test of a config value whose body quantizes."""
    out: list[tuple[str, ast.If, str]] = []
    for rel, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            init = _init(cls)
            if init is None:
                continue
            for node in _walk_own(init):
                if isinstance(node, ast.If) and any(_is_quant_call(n) for s in node.body for n in _walk_own(s) + [s]):
                    call = next(n for s in node.body for n in [s, *_walk_own(s)] if _is_quant_call(n))
                    for key in _keys_of(node.test):
                        out.append((key, node, f"{rel}:{getattr(call, 'lineno', node.lineno)}"))
    return out


def _switch_off(trees: dict[str, ast.Module], config: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """({key: value that skips every quantizing branch}, sites, keys) for the switches config.json turns on."""
    overrides: dict[str, Any] = {}
    sites: list[str] = []
    keys: list[str] = []
    by_key: dict[str, list[tuple[ast.If, str]]] = {}
    for key, node, where in _switches(trees):
        by_key.setdefault(key, []).append((node, where))
    for key, branches in by_key.items():
        if key not in config or not any(_evaluate(n.test, key, config[key]) is True for n, _ in branches):
            continue
        candidates = [*_literals_for(list(trees.values()), key), *_FALSY]
        off = next((c for c in candidates if c != config[key] and
                    all(_evaluate(n.test, key, c) is False for n, _ in branches)), _UNKNOWN)
        if off is _UNKNOWN:
            continue
        overrides[key] = off
        sites += [w for n, w in branches if _evaluate(n.test, key, config[key]) is True]
        keys.append(key)
    return overrides, sites, keys


# ---------------------------------------------------------------------------------------------
# The quantizing subclass
# ---------------------------------------------------------------------------------------------


def _quantizing_init(node: ast.ClassDef) -> ast.AST | None:
    """The first quantizing call or CUDA-only quantization import of a class's own __init__, outside any
    test of a value (an unconditional swap of its layers)."""
    init = _init(node)
    if init is None:
        return None
    conditional = {id(n) for s in _walk_own(init) if isinstance(s, ast.If) for n in _walk_own(s)}
    own = sorted((n for n in _walk_own(init) if id(n) not in conditional), key=lambda x: getattr(x, "lineno", 0))
    return next((n for n in own if _is_quant_call(n)), None) or next(
        (n for n in own if isinstance(n, ast.Import | ast.ImportFrom) and any(_lib_of(m, _QUANT_LIBS)
                                                                             for m in _imports_of(n))), None)


def _defines(node: ast.ClassDef, name: str) -> bool:
    return any(isinstance(b, ast.FunctionDef) and b.name == name for b in node.body)


def _float_base(classes: dict[str, ast.ClassDef], node: ast.ClassDef) -> str | None:
    """The nearest local base that is a complete model (a forward of its own or a local base's) and does not
    quantize in its own constructor; None when the subclass changes the computation itself (a forward of
    its own)."""
    if _defines(node, "forward"):
        return None
    for base in (classes.get(_base_name(b)) for b in node.bases):
        if base is None or _quantizing_init(base) is not None:
            continue
        seen, todo = set(), [base]
        while todo:
            c = todo.pop()
            if c.name in seen:
                continue
            seen.add(c.name)
            if _defines(c, "forward"):
                return base.name
            todo += [b for b in (classes.get(_base_name(x)) for x in c.bases) if b is not None]
    return None


def _kernels(trees: dict[str, ast.Module]) -> list[str]:
    """The CUDA-only kernel libraries the model's files import (bitsandbytes, triton ...), sorted."""
    return sorted({lib for tree in trees.values() for m in _imports_of(tree) if (lib := _lib_of(m, _KERNEL_LIBS))})


def _files_quantization(root: Path, config: dict[str, Any]) -> tuple[str, str] | None:
    """(scheme, site) when the checkpoint's files say it is quantized: config.json's quantization_config or
    AutoGPTQ's quantize_config.json."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = quant.get("quant_method") or ("bitsandbytes" if quant.get("load_in_4bit") or quant.get("load_in_8bit")
                                               else "unknown")
        bits = quant.get("bits") or ("4" if quant.get("load_in_4bit") else "8" if quant.get("load_in_8bit") else "")
        return f"{method}{f' {bits}-bit' if bits else ''} weights (config.json quantization_config)", \
            "config.json quantization_config"
    path = root / "quantize_config.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(errors="replace"))
        except json.JSONDecodeError:
            data = {}
        bits = data.get("bits") if isinstance(data, dict) else None
        return f"GPTQ{f' {bits}-bit' if bits else ''} weights (quantize_config.json)", "quantize_config.json"
    return None


def _trees(root: Path) -> dict[str, ast.Module]:
    """The model's Python files, parsed, by relative path (hidden folders and caches left out)."""
    out: dict[str, ast.Module] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        try:
            out[rel.as_posix()] = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
    return out


def quantized_path(root: Path, classes: dict[str, ast.ClassDef], entry_class: str,
                   config: dict[str, Any]) -> QuantPath | None:
    """The float path a port of this release builds (QuantPath), or None when nothing in it is quantized.
    ``classes``: the entry module's classes and those of its sibling modules (agents/entry.py
    ``_package_classes``)."""
    trees = _trees(root)
    kernels = _kernels(trees)
    entry = classes.get(entry_class)
    call = _quantizing_init(entry) if entry is not None else None
    if entry is not None and call is not None:
        base = _float_base(classes, entry)
        if base is not None:
            rel = next((r for r, t in trees.items() if any(isinstance(n, ast.ClassDef) and n.name == entry.name
                                                          and n.lineno == entry.lineno for n in t.body)), "?")
            what = f"{_callee(call)}()" if isinstance(call, ast.Call) else "a quantization import"
            scheme = f"layers swapped by {what} in {entry_class}.__init__" + (
                f"; kernels: {', '.join(kernels)}" if kernels else "")
            return QuantPath(scheme=scheme, sites=[f"{rel}:{getattr(call, 'lineno', entry.lineno)}"],
                             entry_class=entry_class, float_class=base)
    overrides, sites, keys = _switch_off(trees, config)
    if overrides:
        shown = ", ".join(f"{k}={config[k]!r}" for k in keys)
        scheme = f"config.json {shown} turns quantized layers on" + (f"; kernels: {', '.join(kernels)}" if kernels
                                                                     else "")
        return QuantPath(scheme=scheme, sites=sites, entry_class=entry_class, overrides=overrides)
    files = _files_quantization(root, config)
    if files:
        return QuantPath(scheme=files[0], sites=[files[1]], entry_class=entry_class)
    return None
