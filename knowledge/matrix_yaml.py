"""op-plugin's ``op_plugin_functions.yaml``: which ops have an NPU kernel for a torch version.

Fields (op-plugin's config README): ``all_version`` lists the torch versions of the file;
each entry's ``acl_op`` / ``op_api`` is ``all_version``, a comma list (``v2.1, v2.2``), or a
closed range in brackets (``[v2.1, newest]``, ``[v2.1, v2.12]``; ``newest`` = the last of
``all_version``). Sections: ``official`` (aten), ``symint`` and ``quant`` (aten too),
``autograd`` and ``custom`` (torch_npu ops, mostly ``npu_*``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from knowledge.errors import YamlError

ATEN_SECTIONS = ("official", "symint", "quant")
CUSTOM_SECTIONS = ("custom", "autograd")

Version = tuple[int, int]


def parse_version(v: str) -> Version:
    """``v2.13`` / ``2.13`` / ``2.13.0`` / ``2.10.0.post4`` -> (2, 13)."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)", str(v))
    if not m:
        raise YamlError(f"not a torch version: {v!r}")
    return int(m.group(1)), int(m.group(2))


def versions_of(field: Any, all_versions: list[Version]) -> set[Version]:
    """The torch versions an ``acl_op`` / ``op_api`` value covers."""
    if field is None or field is False:
        return set()
    if isinstance(field, str):
        text = field.strip()
        if text == "all_version":
            return set(all_versions)
        if text.startswith("["):  # a range yaml kept as a string, e.g. "[v2.1, newest]"
            return versions_of([t.strip() for t in text.strip("[]").split(",")], all_versions)
        return {parse_version(t) for t in text.split(",") if t.strip()}
    if isinstance(field, list):
        items = [str(t).strip() for t in field]
        if len(items) != 2:
            raise YamlError(f"a version range needs two ends, got {field!r}")
        newest = max(all_versions) if all_versions else None
        ends = [newest if t == "newest" else parse_version(t) for t in items]
        lo, hi = ends
        if lo is None or hi is None:
            raise YamlError(f"'newest' without all_version in {field!r}")
        # A range covers the file's versions between its ends (both ends included).
        return {v for v in all_versions if lo <= v <= hi}
    raise YamlError(f"unexpected version field {field!r}")


_FUNC_RE = re.compile(r"^\s*([A-Za-z0-9_]+)(?:\.([A-Za-z0-9_]+))?\s*\((.*)\)\s*->", re.S)


@dataclass(frozen=True)
class YamlOp:
    name: str  # base name, e.g. "add_" or "npu_rms_norm"
    overload: str  # "" for the default overload
    section: str
    acl_op: bool
    op_api: bool
    is_out: bool  # an out= variant (kwarg-only mutable Tensor args): C++ name gets "_out"
    exec: str | None  # aclnn kernel named by gen_opapi.exec

    @property
    def key(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def kernel(self) -> str:
        return "both" if self.acl_op and self.op_api else "op_api" if self.op_api else "acl_op"


def _is_out_schema(args: str) -> bool:
    star = args.find("*")
    return star >= 0 and re.search(r"Tensor\([a-z]+!\)", args[star:]) is not None


def split_func(func: str) -> tuple[str, str, bool]:
    """``add.out(Tensor self, ..., *, Tensor(a!) out) -> Tensor(a!)`` -> ("add", "out", True)."""
    m = _FUNC_RE.match(func)
    if not m:
        raise YamlError(f"not an op schema: {func[:80]!r}")
    return m.group(1), m.group(2) or "", _is_out_schema(m.group(3))


def load_yaml(path: Path) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster
    try:
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader)  # noqa: S506
    except yaml.YAMLError as e:
        raise YamlError(f"{path}: not valid yaml: {e}") from e
    if not isinstance(data, dict) or "all_version" not in data:
        raise YamlError(f"{path}: not an op-plugin functions yaml (no all_version)")
    return data


def _exec_name(entry: dict[str, Any], by_key: dict[str, dict[str, Any]]) -> str | None:
    gen = entry.get("gen_opapi")
    for _ in range(3):  # follow structured_inherit a few steps
        if not isinstance(gen, dict):
            return None
        if isinstance(gen.get("exec"), str):
            return gen["exec"].split(",")[0].strip() or None
        parent = by_key.get(str(gen.get("structured_inherit", "")))
        gen = parent.get("gen_opapi") if parent else None
    return None


def ops_for_version(data: dict[str, Any], torch_version: str) -> list[YamlOp]:
    """Entries whose ``acl_op`` or ``op_api`` covers ``torch_version`` (e.g. "2.13")."""
    all_versions = [parse_version(v) for v in data.get("all_version") or []]
    target = parse_version(torch_version)
    by_key: dict[str, dict[str, Any]] = {}
    for section in (*ATEN_SECTIONS, *CUSTOM_SECTIONS):
        for e in data.get(section) or []:
            if isinstance(e, dict) and isinstance(e.get("func"), str):
                by_key.setdefault(_func_key(e["func"]), e)
    out: list[YamlOp] = []
    for section in (*ATEN_SECTIONS, *CUSTOM_SECTIONS):
        for e in data.get(section) or []:
            if not isinstance(e, dict) or not isinstance(e.get("func"), str):
                continue
            acl = target in versions_of(e.get("acl_op"), all_versions)
            api = target in versions_of(e.get("op_api"), all_versions)
            if not (acl or api):
                continue
            name, overload, is_out = split_func(e["func"])
            out.append(YamlOp(name, overload, section, acl, api, is_out, _exec_name(e, by_key)))
    return out


def all_named(data: dict[str, Any]) -> dict[str, str]:
    """Every op key the yaml names in any version -> its section (for classifying disagreements)."""
    named: dict[str, str] = {}
    for section in (*ATEN_SECTIONS, *CUSTOM_SECTIONS):
        for e in data.get(section) or []:
            if isinstance(e, dict) and isinstance(e.get("func"), str):
                named.setdefault(_func_key(e["func"]), section)
    return named


def _func_key(func: str) -> str:
    name, overload, _ = split_func(func)
    return f"{name}.{overload}" if overload else name


# The wheel's own codegen yaml (wheel.CODEGEN_YAML_MEMBER): the ops this build compiled.
def codegen_ops(text: str | None) -> dict[str, tuple[str, str]]:
    """op key -> (origin, kernel): origin "core" (torch_npu's own op) or "op_plugin"."""
    if not text:
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(text, Loader=loader)  # noqa: S506
    out: dict[str, tuple[str, str]] = {}
    for section in ("supported", "symint", "quant", "autograd", "custom"):
        for e in (data or {}).get(section) or []:
            func = e if isinstance(e, str) else e.get("func") if isinstance(e, dict) else None
            if not isinstance(func, str):
                continue
            key = func.split("(")[0].strip()
            impl = str(e.get("impl_ns", "")) if isinstance(e, dict) else ""
            kernel = (
                "both"
                if "acl_op" in impl and "op_api" in impl
                else "op_api"
                if "op_api" in impl
                else "acl_op"
                if "acl_op" in impl
                else "unknown"
            )
            out.setdefault(key, ("op_plugin" if "(" in func else "core", kernel))
    return out
