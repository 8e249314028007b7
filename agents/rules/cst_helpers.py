"""Small libcst helpers shared by the hazard detectors (agents/rules/h*.py) and the scan index."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import libcst as cst

_WHITESPACE_NODES = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
                     cst.Newline, cst.Comment, cst.LeftParen, cst.RightParen, cst.Comma, cst.Dot)

_FIELDS: dict[type, tuple[str, ...]] = {}


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Child nodes in field order, without whitespace/comment nodes."""
    t = type(node)
    names = _FIELDS.get(t)
    if names is None:
        names = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(t))  # type: ignore[arg-type]
    out: list[cst.CSTNode] = []
    for name in names:
        v = getattr(node, name)
        if isinstance(v, cst.CSTNode):
            if not isinstance(v, _WHITESPACE_NODES):
                out.append(v)
        elif isinstance(v, tuple | list):
            out.extend(c for c in v if isinstance(c, cst.CSTNode) and not isinstance(c, _WHITESPACE_NODES))
    return out


def dotted(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def root_name(node: cst.CSTNode) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def last_name(func: cst.CSTNode) -> str:
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return ""


def aliases(imports: Sequence[cst.Import | cst.ImportFrom]) -> dict[str, str]:
    """Local name -> full dotted name, from the module's imports (relative ones keep their dots)."""
    out: dict[str, str] = {}
    for imp in imports:
        if isinstance(imp, cst.Import):
            for a in imp.names:
                full = dotted(a.name) or ""
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    out[a.asname.name.value] = full
                else:
                    head = full.partition(".")[0]
                    out.setdefault(head, head)
        elif not isinstance(imp.names, cst.ImportStar):
            base = "." * len(imp.relative) + (dotted(imp.module) or "" if imp.module else "")
            for a in imp.names:
                name = dotted(a.name) or ""
                local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else name
                out[local] = f"{base}.{name}" if base and not base.endswith(".") else f"{base}{name}"
    return out


def import_module_names(imp: cst.Import | cst.ImportFrom) -> list[tuple[str, list[str]]]:
    """(module, local names it binds) per imported module."""
    if isinstance(imp, cst.Import):
        out = []
        for a in imp.names:
            full = dotted(a.name) or ""
            local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else full.split(".")[0]
            out.append((full, [local]))
        return out
    if imp.relative or imp.module is None:
        return []
    mod = dotted(imp.module) or ""
    if isinstance(imp.names, cst.ImportStar):
        return [(mod, [])]
    locals_ = [a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else dotted(a.name) or ""
               for a in imp.names]
    # `from vllm.model_executor.layers import fused_moe` imports the module itself
    return [(mod, locals_)] + [(f"{mod}.{dotted(a.name)}", [loc]) for a, loc in zip(imp.names, locals_,
                                                                                     strict=True)]


def match_prefix(name: str, table: Iterable[str]) -> str | None:
    for key in table:
        if name == key or name.startswith(key + "."):
            return key
    return None


def string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        v = node.evaluated_value
        return v if isinstance(v, str) else None
    if isinstance(node, cst.FormattedString):
        # the leading literal text is enough to recognise f"cuda:{rank}"
        text = "".join(p.value for p in node.parts if isinstance(p, cst.FormattedStringText))
        first = node.parts[0] if node.parts else None
        return text if isinstance(first, cst.FormattedStringText) else None
    return None


def is_cuda_device_string(value: str | None) -> bool:
    return value is not None and (value == "cuda" or value.startswith("cuda:"))


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def positional(call: cst.Call, i: int) -> cst.BaseExpression | None:
    pos = [a for a in call.args if a.keyword is None and not a.star]
    return pos[i].value if len(pos) > i else None


def walk_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for c in children(node):
        yield from walk_nodes(c)

