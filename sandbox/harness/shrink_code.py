"""The sizes a model's code fixes whatever its config says: integer literals used as sizes (a layer's size
argument, a size-named keyword, parameter default or variable). A config width equal to one is kept by the
shrink (sandbox/harness/shrink.py), citing the line. Used inside the sandbox: standard library only."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MIN_HARD_WIDTH = 64  # smaller literals are too common (kernel sizes, counts) to tie to a config width


# A literal is a size only where the code uses it as one: a layer's size argument, or bound to a size-named
# keyword, parameter or variable (``n_embed = 96``, ``def f(dim=896)``, ``Config(hidden_size=896)``).
SIZE_NAME = re.compile(r"(^|_)(dim|dims|dimension|size|hidden|embed|embd|width|channels|chans|filters|features|d_model|"
                       r"units|planes)(_|$)", re.I)
NOT_A_SIZE = re.compile(r"kernel|stride|pad|window|eps|batch|position|seq|length|token|vocab|worker|seed|image|"
                        r"patch|max|min|cache|chunk|block|bucket|timeout|step", re.I)
SIZE_LAYERS = frozenset({"Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "LayerNorm", "GroupNorm", "RMSNorm",
                         "MultiheadAttention", "BatchNorm1d", "BatchNorm2d", "ConvTranspose2d", "Bilinear"})


# torch's constructors of a tensor of a given shape (positional sizes or one list / tuple of them)
TENSOR_MAKERS = frozenset({"zeros", "ones", "empty", "randn", "rand", "full"})


def _size_name(name: str | None) -> bool:
    return bool(name) and bool(SIZE_NAME.search(name or "")) and not NOT_A_SIZE.search(name or "")


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def hard_coded_widths(model_dir: Path) -> dict[int, list[tuple[str, str | None]]]:
    """Integer literals the model's code uses as sizes: ``n_embed = 1280``, ``def f(dim=896)``,
    ``Config(hidden_size=896)``, ``nn.Linear(1280, ...)``: {value: [("file:line `code`", parameter name
    for a default else None)]}. A config width equal to one is kept by the shrink: the code builds that
    size whatever the config says, and a shrunk config would no longer fit it. The same number elsewhere
    (``timeout = 1280``, ``max_length=4096``) is not a size, and is never cited as one."""
    found: dict[int, list[tuple[str, str | None]]] = {}

    def note(value: Any, path: Path, node: ast.AST, lines: list[str], param: str | None = None) -> None:
        if _int(value) and value >= MIN_HARD_WIDTH:
            line = getattr(node, "lineno", 0)
            code = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            found.setdefault(value, []).append((f"{path.relative_to(model_dir).as_posix()}:{line} \"{code[:80]}\"",
                                                param))

    for path in sorted(model_dir.rglob("*.py")):
        if any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(model_dir).parts):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        # A config class's __init__ defaults are what the config overrides, not sizes the code fixes.
        config_nodes = {id(n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and _is_config_class(c)
                        for n in ast.walk(c)}
        for node in ast.walk(tree):
            if id(node) in config_nodes:
                continue
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
                         for t in targets]
                if any(_size_name(n) for n in names):
                    note(node.value.value, path, node, lines)
            elif isinstance(node, ast.arguments):
                positional = [*node.posonlyargs, *node.args]
                for arg, d in zip(positional[len(positional) - len(node.defaults):], node.defaults, strict=True):
                    if isinstance(d, ast.Constant) and _size_name(arg.arg):
                        note(d.value, path, d, lines, arg.arg)
                for arg, kd in zip(node.kwonlyargs, node.kw_defaults, strict=True):
                    if isinstance(kd, ast.Constant) and _size_name(arg.arg):
                        note(kd.value, path, kd, lines, arg.arg)
            elif isinstance(node, ast.Call) and _callee(node) in TENSOR_MAKERS:
                # torch.zeros([1, 1, 4096]): a tensor of a fixed shape (a learned flag, a query bank) that the
                # code concatenates with the model's activations, so its width is the model's
                for a in node.args:
                    for dim in (a.elts if isinstance(a, ast.List | ast.Tuple) else [a]):
                        if isinstance(dim, ast.Constant):
                            note(dim.value, path, dim, lines)
            elif isinstance(node, ast.Call):
                layer = _callee(node) in SIZE_LAYERS
                for a in node.args:
                    if isinstance(a, ast.Constant) and layer:
                        note(a.value, path, a, lines)
                for k in node.keywords:
                    if isinstance(k.value, ast.Constant) and (_size_name(k.arg) or (layer and k.arg in (
                            "in_features", "out_features", "embedding_dim", "normalized_shape", "embed_dim"))):
                        note(k.value.value, path, k.value, lines)
    return found


def _is_config_class(node: ast.ClassDef) -> bool:
    names = [node.name, *(b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases)]
    return any(n.endswith("Config") for n in names)
