"""The op-support matrix of a torch_npu build, made from real sources only.

Sources, all read at run time from what the user has:
- the torch_npu wheel (installed, a local ``.whl``, or downloaded): kernel wrapper symbols and
  CPU-fallback warnings in ``libtorch_npu.so``, the build's own codegen yaml, and the custom-op
  names documented in ``_op_plugin_docs.py``;
- op-plugin's ``op_plugin_functions.yaml`` (optional, per torch version);
- torch_npu's native-API docs folder (optional: dtype allow-lists, per-product support).

Rules (docs/architecture.md, "Op-support matrix JSON"):
- ``npu`` is true when the op runs on the NPU without the CPU fallback. With a wheel, the wheel
  decides own kernels (an ``NPU`` wrapper); the yaml then adds kernel kind and aclnn name only.
  Without a wheel the yaml decides.
- The wheel's fallback warnings ("kernel [sinc] is not supported by NPU currently...") mark an op
  ``npu: false, fallback: true`` even though a wrapper is registered: its kernel runs on the CPU.
  The binary cannot tell whether that happens for all inputs or some; we assume all.
- Composite ops need no kernel of their own: ``CompositeImplicitAutograd`` ops decompose before
  the backend (``composite: "implicit"``); ``CompositeExplicitAutograd`` ops, most view ops among
  them (transpose, expand, select, ...: pure metadata over the base), share one kernel with every
  backend (``"explicit"``). Both are ``npu: true, kernel: "composite"``. Structured functional and
  in-place variants whose only kernel is ``CompositeExplicitAutogradNonFunctional`` call their
  ``.out`` op (``"nonfunctional"``, ``decomposes_to``): supported exactly when that op is.
  View ops with backend kernels of their own (``view``, ``as_strided``) need an NPU wrapper like
  any other op. ``view: true`` marks ops whose schema returns an alias of an input.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from knowledge import matrix_yaml as my
from knowledge.errors import MatrixError
from knowledge.home import cache_dir
from knowledge.matrix_aten import AtenRegistry, aten_registry
from knowledge.matrix_compare import KERNEL_KEYS, compare_wheel_yaml
from knowledge.matrix_docs import docs_by_aten_name, documented_custom_ops, parse_docs_dir
from knowledge.matrix_symbols import (
    OpName,
    normalise_fallback_name,
    resolve,
    scan_library,
    split_key,
    wrapper_table,
)
from knowledge.matrix_yaml import codegen_ops
from knowledge.wheel import (
    CODEGEN_YAML_MEMBER,
    DOCS_MEMBER,
    WheelReader,
    file_sha256,
    locate_wheel,
    read_text,
    wheel_version,
)

SCHEMA = 1


@dataclass
class OpMatrix:
    torch_npu_version: str
    torch_version: str
    sources: list[dict[str, Any]]
    ops: dict[str, dict[str, Any]]
    fallback_ops: list[str]
    custom_ops: list[str]
    schema: int = SCHEMA
    # Extras beyond the documented schema.
    fallback_messages: dict[str, str] = field(default_factory=dict)  # op -> the sentence the wheel prints
    custom_op_via: dict[str, list[str]] = field(default_factory=dict)
    unresolved_wrappers: list[str] = field(default_factory=list)
    registry_torch_version: str = ""  # the torch whose op registry resolved names
    build: dict[str, Any] = field(default_factory=dict)  # counts and timings of the build

    # --- queries -------------------------------------------------------------------------

    def entry(self, op: str) -> dict[str, Any] | None:
        return self.ops.get(op_key(op))

    def has_npu_kernel(self, op: str) -> bool:
        """True when ``op`` runs on the NPU without the CPU fallback (own kernel or composite)."""
        e = self.entry(op)
        return bool(e and e.get("npu"))

    def has_own_kernel(self, op: str) -> bool:
        """True only for an NPU kernel of the op's own (not composite)."""
        e = self.entry(op)
        return bool(e and e.get("npu") and e.get("kernel") != "composite")

    def is_fallback(self, op: str) -> bool:
        """True when the wheel says this op's kernel runs on the CPU."""
        e = self.entry(op)
        return bool(e and e.get("fallback"))

    def dtypes(self, op: str) -> list[str] | None:
        e = self.entry(op)
        return e.get("dtypes") if e else None

    def is_custom(self, name: str) -> bool:
        return name.removeprefix("npu::").removeprefix("torch_npu.").split(".")[0] in set(self.custom_ops)

    def summary(self) -> dict[str, Any]:
        ops = self.ops.values()
        kernels: dict[str, int] = {}
        for e in ops:
            if e.get("npu"):
                kernels[e["kernel"]] = kernels.get(e["kernel"], 0) + 1
        comp = {
            k: sum(1 for e in ops if e.get("composite") == k and e.get("npu"))
            for k in ("implicit", "explicit", "nonfunctional")
        }
        out: dict[str, Any] = {
            "torch_npu_version": self.torch_npu_version,
            "torch_version": self.torch_version,
            "sources": {s["kind"]: s["path"] for s in self.sources},
            "ops": len(self.ops),
            "npu_ops": sum(1 for e in ops if e.get("npu")),
            "own_kernels": sum(1 for e in ops if e.get("npu") and e["kernel"] != "composite"),
            "by_kernel": dict(sorted(kernels.items())),
            "composite": comp,
            "via_wheel": sum(1 for e in ops if "wheel" in e["via"]),
            "via_yaml": sum(1 for e in ops if "yaml" in e["via"]),
            "with_dtypes": sum(1 for e in ops if e.get("dtypes")),
            "fallback_ops": len(self.fallback_ops),
            "custom_ops": len(self.custom_ops),
            "unresolved_wrappers": len(self.unresolved_wrappers),
            "build": self.build,
        }
        if any(s["kind"] == "wheel" for s in self.sources) and any(s["kind"] == "yaml" for s in self.sources):
            cmp = compare_wheel_yaml(self)
            out["agreement"] = {k: cmp[k] for k in ("compared", "agree", "agreement", "by_reason")}
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        order = [
            "schema",
            "torch_npu_version",
            "torch_version",
            "sources",
            "ops",
            "fallback_ops",
            "custom_ops",
        ]
        return {k: d[k] for k in order} | {k: v for k, v in d.items() if k not in order}

    def save(self, path: Path | None = None) -> Path:
        path = path or matrix_path(self.torch_npu_version)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(
            json.dumps(self.to_json(), indent=1, sort_keys=False, ensure_ascii=False), encoding="utf-8"
        )
        tmp.replace(path)
        return path


def op_key(op: str) -> str:
    """``aten::add.Tensor`` -> ``add.Tensor``; ``aten::mm.default`` / ``mm`` -> ``mm``."""
    k = op.removeprefix("aten::")
    return k.removesuffix(".default")


def matrix_path(version: str) -> Path:
    return cache_dir("matrices") / f"torch_npu-{version}.json"


def load_matrix(path: Path) -> OpMatrix:
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise MatrixError(f"cannot read op matrix {path}: {e}") from e
    if d.get("schema") != SCHEMA:
        raise MatrixError(f"{path}: op matrix schema {d.get('schema')!r}, expected {SCHEMA}")
    known = OpMatrix.__dataclass_fields__
    return OpMatrix(**{k: v for k, v in d.items() if k in known})


def load_or_build(
    version: str,
    *,
    wheel: Path | None = None,
    yaml_paths: list[Path] | None = None,
    docs_dir: Path | None = None,
    rebuild: bool = False,
) -> OpMatrix:
    """The stored matrix for ``version`` if present (and not ``rebuild``), else build and store it."""
    path = matrix_path(version)
    if path.is_file() and not rebuild:
        return load_matrix(path)
    m = build_matrix(version, wheel=wheel, yaml_paths=yaml_paths or [], docs_dir=docs_dir)
    m.save(path)
    return m


def torch_version_for(torch_npu_version: str) -> str:
    """torch_npu X.Y.z[.postN] pairs with torch X.Y (COMPATIBILITY table)."""
    major, minor = my.parse_version(torch_npu_version)
    return f"{major}.{minor}"


# --- building --------------------------------------------------------------------------------


@dataclass
class _Build:
    """Working state while a matrix is assembled."""

    reg: AtenRegistry
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    custom_via: dict[str, set[str]] = field(default_factory=dict)
    unresolved: list[str] = field(default_factory=list)
    fallback_messages: dict[str, str] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def entry(self, key: str) -> dict[str, Any]:
        e = self.ops.get(key)
        if e is None:
            e = {
                "npu": False,
                "via": [],
                "kernel": "unknown",
                "exec": None,
                "dtypes": None,
                "wheel_keys": [],
                "yaml_kernel": None,
                "composite": None,
                "view": key in self.reg.views,
                "fallback": False,
            }
            self.ops[key] = e
        return e


def _read_yaml(b: _Build, yaml_paths: list[Path], torch_ver: str) -> tuple[list[my.YamlOp], dict[str, str]]:
    """op-plugin's yaml: the ops declared for ``torch_ver`` and every name it declares for any version."""
    yaml_ops: list[my.YamlOp] = []
    yaml_any: dict[str, str] = {}
    t = time.perf_counter()
    for p in yaml_paths:
        data = my.load_yaml(p)
        yaml_ops += my.ops_for_version(data, torch_ver)
        for k, sec in my.all_named(data).items():
            yaml_any.setdefault(k, sec)
        b.sources.append({"kind": "yaml", "path": str(p), "sha256": file_sha256(Path(p))})
    b.timings["yaml_s"] = time.perf_counter() - t
    b.counts["yaml_ops_for_version"] = len(yaml_ops)
    return yaml_ops, yaml_any


def _read_wheel(b: _Build, reader: WheelReader, version: str, yaml_ops: list[my.YamlOp]) -> None:
    """The wheel's kernels, codegen list, documented custom ops and fallback messages (closes ``reader``)."""
    t = time.perf_counter()
    found = wheel_version(reader)
    if found is not None and my.parse_version(found) != my.parse_version(version):
        raise MatrixError(f"{reader.origin} is torch_npu {found}, not {version}")
    b.sources.append({"kind": "wheel", "path": reader.origin, "sha256": reader.sha256(), "version": found})
    codegen = codegen_ops(read_text(reader, CODEGEN_YAML_MEMBER))
    documented = documented_custom_ops(read_text(reader, DOCS_MEMBER))
    b.timings["wheel_text_s"] = time.perf_counter() - t
    t = time.perf_counter()
    scan = scan_library(reader)
    b.timings["wheel_scan_s"] = time.perf_counter() - t
    _apply_wheel(b, scan.wrappers, yaml_ops, codegen, b.custom_via, b.unresolved)
    _apply_direct(b, scan.direct, yaml_ops)
    for raw, msg in scan.fallback_messages.items():
        key = normalise_fallback_name(raw, set(b.reg.ops))
        b.fallback_messages[key] = msg
    for name in documented:
        b.custom_via.setdefault(name.split(".")[0], set()).add("docs")
    reader.close()
    b.counts |= {
        "wheel_wrappers": len(scan.wrappers),
        "wheel_documented_custom": len(documented),
        "wheel_codegen_ops": len(codegen),
    }


def _read_docs(b: _Build, docs_dir: Path) -> None:
    """The API docs' dtypes and products of each op they document."""
    t = time.perf_counter()
    docs = parse_docs_dir(Path(docs_dir))
    by_name = docs_by_aten_name(docs, b.reg.names)
    for key, e in b.ops.items():
        d = by_name.get(b.reg.ops[key].name) if key in b.reg.ops else None
        if d is not None:
            e["dtypes"] = d.dtypes
            e["products"] = d.products
            if "docs" not in e["via"]:
                e["via"].append("docs")
    b.sources.append(
        {"kind": "docs", "path": str(docs_dir), "sha256": _dir_digest(Path(docs_dir)), "apis": len(docs)}
    )
    b.timings["docs_s"] = time.perf_counter() - t


def build_matrix(
    version: str,
    *,
    wheel: Path | None = None,
    yaml_paths: list[Path] | None = None,
    docs_dir: Path | None = None,
    use_wheel: bool = True,
) -> OpMatrix:
    """Build the matrix for torch_npu ``version`` (e.g. "2.13.0").

    ``wheel``: a ``.whl`` or unpacked tree; without it an installed torch_npu, the wheel cache, or
    ``pip download`` is used (``use_wheel=False`` builds from the yaml alone).
    """
    t0 = time.perf_counter()
    torch_ver = torch_version_for(version)
    # Open the wheel before importing torch, so a bad path fails at once.
    reader = locate_wheel(version, wheel) if use_wheel else None
    reg = aten_registry()
    b = _Build(reg)
    b.timings["registry_s"] = time.perf_counter() - t0
    # yaml first: its names help split wrapper symbols.
    yaml_ops, yaml_any = _read_yaml(b, yaml_paths or [], torch_ver)
    if reader is not None:
        _read_wheel(b, reader, version, yaml_ops)
    _apply_yaml(b, yaml_ops, b.custom_via, decides=reader is None)
    _apply_fallbacks(b, b.fallback_messages)
    _apply_composites(b)
    for key, e in b.ops.items():
        if key in yaml_any:
            e["yaml_named"] = True  # the yaml names it for some torch version: op-plugin's scope
    if docs_dir is not None:
        _read_docs(b, docs_dir)
    b.timings["total_s"] = time.perf_counter() - t0
    fallback_messages, custom_via = b.fallback_messages, b.custom_via
    return OpMatrix(
        torch_npu_version=version,
        torch_version=torch_ver,
        sources=b.sources,
        ops=dict(sorted(b.ops.items())),
        fallback_ops=sorted(fallback_messages),
        custom_ops=sorted(custom_via),
        fallback_messages=dict(sorted(fallback_messages.items())),
        custom_op_via={k: sorted(v) for k, v in sorted(custom_via.items())},
        unresolved_wrappers=sorted(b.unresolved),
        registry_torch_version=reg.torch_version,
        build={"counts": b.counts, "timings": {k: round(v, 3) for k, v in b.timings.items()}},
    )


def _apply_wheel(
    b: _Build,
    wrappers: set[str],
    yaml_ops: list[my.YamlOp],
    codegen: dict[str, tuple[str, str]],
    custom_via: dict[str, set[str]],
    unresolved: list[str],
) -> None:
    reg = b.reg
    extra = [OpName(o.name, o.overload, o.is_out) for o in yaml_ops]
    for key in codegen:
        name, _, overload = key.partition(".")
        extra.append(OpName(name, overload, overload.endswith("out")))
    # torch's names first, so a split that is a real aten op wins.
    table = wrapper_table(list(reg.ops.values()) + extra)
    known = reg.names | {o.name for o in extra}
    for ident in sorted(wrappers):
        w = split_key(ident)
        found, _how = resolve(w.rest, table, known)
        if found is None:
            unresolved.append(ident)
            continue
        key = found
        if w.dispatch_key and key in reg.ops:
            e = b.entry(key)
            if w.dispatch_key not in e["wheel_keys"]:
                e["wheel_keys"].append(w.dispatch_key)
                e["wheel_keys"].sort()
            if w.dispatch_key in KERNEL_KEYS:
                e["npu"] = True
                if "wheel" not in e["via"]:
                    e["via"].append("wheel")
        else:
            # key-less registrations and NPU kernels of non-aten names are torch_npu's own ops
            custom_via.setdefault(key.split(".")[0], set()).add("wheel")
    for key, (origin, kernel) in codegen.items():
        if key in b.ops:
            b.ops[key]["codegen"] = origin
            if kernel != "unknown":
                b.ops[key]["kernel"] = kernel


def _apply_direct(b: _Build, names: set[str], yaml_ops: list[my.YamlOp]) -> None:
    """Kernels registered as bare ``op_plugin::<name>`` pointers (op-plugin's quantized ops).

    The symbol has no overload or dispatch key: the op is the yaml's only entry of that name
    for this version (its section gives the key), else torch's default overload.
    """
    for name in sorted(names):
        cands = [o for o in yaml_ops if o.name == name and o.key in b.reg.ops]
        if len(cands) == 1:
            key, dkey = cands[0].key, "QuantizedNPU" if cands[0].section == "quant" else "NPU"
        elif not cands and name in b.reg.ops:
            key, dkey = name, "NPU"
        else:
            continue
        e = b.entry(key)
        e["wheel_keys"] = sorted({*e["wheel_keys"], dkey})
        e["npu"] = True
        if "wheel" not in e["via"]:
            e["via"].append("wheel")


def _apply_yaml(
    b: _Build, yaml_ops: list[my.YamlOp], custom_via: dict[str, set[str]], *, decides: bool
) -> None:
    for o in yaml_ops:
        if o.section in my.CUSTOM_SECTIONS or o.key not in b.reg.ops:
            if o.section in my.CUSTOM_SECTIONS:
                custom_via.setdefault(o.name, set()).add("yaml")
            continue
        e = b.entry(o.key)
        e["yaml_kernel"] = o.kernel
        e["via"].append("yaml")
        e["kernel"] = o.kernel  # the yaml is the most specific statement of the kernel kind
        e["exec"] = e["exec"] or o.exec
        if decides:
            e["npu"] = True


def _apply_fallbacks(b: _Build, messages: dict[str, str]) -> None:
    for key, msg in messages.items():
        if key not in b.reg.ops:
            continue
        e = b.entry(key)
        e["npu"] = False
        e["fallback"] = True
        e["fallback_message"] = msg


def _out_sibling(op: OpName, ops: dict[str, OpName]) -> str | None:
    """The ``.out`` op a structured functional / in-place op calls (``add.Tensor`` -> ``add.out``)."""
    base = op.name[:-1] if op.name.endswith("_") and not op.name.endswith("__") else op.name
    for cand in (f"{base}.{op.overload}_out" if op.overload else None, f"{base}.out"):
        if cand and cand in ops and ops[cand].is_out:
            return cand
    return None


def _apply_composites(b: _Build) -> None:
    reg = b.reg
    for key, kind in reg.composite.items():
        cur = b.ops.get(key)
        if cur is not None and (cur["npu"] or cur["fallback"]):
            continue  # an own kernel (or a known CPU fallback) wins over the composite
        if kind in ("implicit", "explicit"):
            e = b.entry(key)
            e.update(npu=True, kernel="composite", composite=kind)
            if "torch" not in e["via"]:
                e["via"].append("torch")
            continue
        sib = _out_sibling(reg.ops[key], reg.ops)
        if sib is None or sib not in b.ops:
            continue
        s = b.ops[sib]
        e = b.entry(key)
        e.update(composite="nonfunctional", decomposes_to=sib, kernel="composite")
        e["npu"] = bool(s["npu"])
        if s["fallback"]:
            e["fallback"] = True
        if "torch" not in e["via"]:
            e["via"].append("torch")


def _dir_digest(d: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    for p in sorted(d.rglob("*.md")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()
