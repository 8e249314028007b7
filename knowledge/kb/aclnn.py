"""The CANN operator reference: aclnn API docs (`<family>/<op>/docs/aclnn*.md` in hicann/ops-*).

One doc describes one operator family (`aclnnLog&aclnnInplaceLog`): supported products, function,
parameters with dtype/format support (a table, plus per-product notes), constraints and the
parameter errors its first phase returns. Each doc becomes two chunks keyed by its aclnn names and
the aten ops that reach them (op-plugin's `exec` field, else the name rule validated against the
op names op-plugin knows), and its dtype table is parsed into structured fields per chip so a port
report can say which dtypes an op supports on the chosen chip (`supported_dtypes`).

Pure text work (regex, yaml); nothing here imports chromadb.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from knowledge.kb.chunking import clean, digest
from knowledge.kb.identifiers import extract_keys
from knowledge.kb.models import Chunk

# Chips as the docs' `<!-- npu="..." -->` markers name them, and how product names map to them.
CHIPS = ("950", "A3", "910b", "310b", "310p", "910")
CHIP_NAMES = {
    "950": "Ascend 950",
    "A3": "Atlas A3",
    "910b": "Atlas A2 (910B)",
    "310b": "Atlas 200I/500 A2 (310B)",
    "310p": "Atlas inference (310P)",
    "910": "Atlas training (910)",
}
_PRODUCT_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("950", re.compile(r"950")),
    ("A3", re.compile(r"A3")),
    ("310b", re.compile(r"200I|500\s*A2")),
    ("910b", re.compile(r"A2")),
    ("310p", re.compile(r"推理系列|310P|300I|inference", re.I)),
    ("910", re.compile(r"训练系列|910|training", re.I)),
]
_DTYPE = re.compile(  # no \b: in Chinese text the neighbours are word characters too
    r"(?<![A-Z0-9_])(HIFLOAT8|FLOAT8_E4M3FN|FLOAT8_E5M2|FLOAT8_E8M0|FLOAT4_E2M1|FLOAT4_E1M2|BFLOAT16|FLOAT16|FLOAT32|"
    r"FLOAT|DOUBLE|COMPLEX32|COMPLEX64|COMPLEX128|UINT64|UINT32|UINT16|UINT8|UINT1|INT64|INT32|INT16|INT8|"
    r"INT4|BOOL)(?![A-Z0-9_])"
)
_NAME = re.compile(r"\baclnn[A-Z][A-Za-z0-9]*")
_PHASE = re.compile(r"GetWorkspaceSize$")
_ROW = re.compile(r"<tr>(.*?)</tr>", re.S)
_CELL = re.compile(r"<t[dh][^>]*>(.*?)</t[dh]>", re.S)
_PARAM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:[（(]\s*(?:const\s+)?acl(?:Tensor|TensorList|Scalar)|$)")
_TERM_NOTE = re.compile(r"<term>([^<]+)</term>\s*[：:]\s*([^<\n]*)")
_BULLET_PARAM = re.compile(
    r"^\s*[-*]\s*([A-Za-z_][A-Za-z0-9_]*)\s*[（(]\s*(?:const\s+)?acl(?:Tensor|TensorList|Scalar)[^)）]*[)）]"
    r"\s*[：:]?(.*)$"
)


def chip_of(product: str) -> str | None:
    """A product or chip name ("Atlas A2 训练系列产品", "Ascend910B3", "310P", "A3") -> a CHIPS key."""
    p = product.strip()
    low = p.lower()
    if "950" in low:
        return "950"
    if "910_93" in low or re.search(r"\ba3\b|atlas\s*a3", low):
        return "A3"
    if re.search(r"310b|200i|500\s*a2", low):
        return "310b"
    if re.search(r"910b|910_9[0-9]?b|\ba2\b|atlas\s*a2|910c", low):
        return "910b"
    if re.search(r"310p|300i|推理系列|inference", low):
        return "310p"
    if re.search(r"910|训练系列|training", low):
        return "910"
    for chip, rx in _PRODUCT_RULES:
        if rx.search(p):
            return chip
    return None


def dtypes_in(text: str) -> list[str]:
    out: list[str] = []
    for m in _DTYPE.finditer(text):
        d = "FLOAT" if m.group(1) == "FLOAT32" else m.group(1)
        if d not in out:
            out.append(d)
    return out


def aclnn_to_ops(name: str) -> list[str]:
    """The aten names an aclnn name suggests: aclnnInplaceAdd -> add_, aclnnLogSoftmax -> log_softmax.

    A rule, not a fact: callers validate it against op names op-plugin knows when they can.
    """
    base = name[len("aclnn") :]
    inplace = base.startswith("Inplace")
    if inplace:
        base = base[len("Inplace") :]
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", base).lower()
    cands = [snake]
    stripped = re.sub(r"_(tensor|scalar|tensor_list|int|out|v\d+|with_dim)$", "", snake)
    if stripped != snake:
        cands.append(stripped)
    if snake.endswith("s") and len(snake) > 3:
        cands.append(snake[:-1])  # aclnnAdds / aclnnMuls: the Scalar overload of add / mul
    cands += [f"_{c}" for c in list(cands)]  # aten's private forms: _log_softmax, _chunk_cat
    return [f"{c}_" if inplace else c for c in cands]


# ---------------------------------------------------------------- op-plugin mapping


@dataclass
class AtenMap:
    """aclnn name (lower case) -> aten ops, from op-plugin tables; plus every op name they know."""

    by_aclnn: dict[str, list[str]] = field(default_factory=dict)
    known_ops: set[str] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)

    def ops_for(self, names: Iterable[str]) -> list[str]:
        out: list[str] = []
        for n in names:
            for op in self.by_aclnn.get(n.lower(), []):
                if op not in out:
                    out.append(op)
            rule = aclnn_to_ops(n)
            for op in rule if self.known_ops else rule[:1]:
                # the name rule is kept when op-plugin knows that op (no tables: its plain reading only)
                if op not in out and (not self.known_ops or op in self.known_ops):
                    out.append(op)
        return out

    def digest(self, names: Iterable[str]) -> str:
        return digest(*self.ops_for(names))

    def add_yaml(self, data: dict[str, Any], source: str) -> None:
        for entries in data.values():
            if not isinstance(entries, list):
                continue
            for e in entries:
                func = e if isinstance(e, str) else e.get("func") if isinstance(e, dict) else None
                if not isinstance(func, str):
                    continue
                op = func.split("(")[0].split(".")[0].strip()
                if not isinstance(e, dict):  # the wheel's codegen list: names only
                    self.known_ops.add(op)
                    continue
                self.known_ops.add(op)
                gen = e.get("gen_opapi")
                ex = gen.get("exec") if isinstance(gen, dict) else None
                if isinstance(ex, str):
                    for a in ex.split(","):
                        a = a.strip()
                        if a.startswith("aclnn"):
                            lst = self.by_aclnn.setdefault(a.lower(), [])
                            if op not in lst:
                                lst.append(op)
        self.sources.append(source)

    def add_matrix(self, matrix: dict[str, Any], source: str) -> None:
        for name, rec in (matrix.get("ops") or {}).items():
            op = str(name).split(".")[0]
            self.known_ops.add(op)
            ex = rec.get("exec") if isinstance(rec, dict) else None
            if isinstance(ex, str) and ex.startswith("aclnn"):
                lst = self.by_aclnn.setdefault(ex.lower(), [])
                if op not in lst:
                    lst.append(op)
        self.sources.append(source)


def load_aten_map(
    yaml_paths: Iterable[Path] = (), matrix_paths: Iterable[Path] = (), yaml_texts: Iterable[tuple[str, str]] = ()
) -> AtenMap:
    """op-plugin tables (files), op matrices, and yaml read from a wheel (``(where, text)``)."""
    import yaml

    amap = AtenMap()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for where, text in yaml_texts:
        data = yaml.load(text, Loader=loader)  # noqa: S506
        if isinstance(data, dict):
            amap.add_yaml(data, where)
    for p in yaml_paths:
        data = yaml.load(Path(p).read_text(encoding="utf-8"), Loader=loader)  # noqa: S506
        if isinstance(data, dict):
            amap.add_yaml(data, str(p))
    for p in matrix_paths:
        try:
            data = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict):
            amap.add_matrix(data, str(p))
    return amap


# ---------------------------------------------------------------- one doc


@dataclass
class AclnnDoc:
    names: list[str]  # aclnn API names (no GetWorkspaceSize), the family's first
    title: str
    function: str = ""
    products: dict[str, bool] = field(default_factory=dict)  # chip -> supported
    # param -> {"*": dtypes for every chip, chip: dtypes on that chip when the doc says otherwise}
    params: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    constraints: str = ""
    errors: str = ""  # the first phase's parameter-error table, as text

    def dtypes(self, chip: str | None = None) -> dict[str, list[str]]:
        """Per tensor parameter, the dtypes it accepts on ``chip`` (None: the general table)."""
        key = chip_of(chip) if chip else None
        out: dict[str, list[str]] = {}
        for p, by in self.params.items():
            got = by.get(key, by.get("*", [])) if key else by.get("*", [])
            if got:
                out[p] = list(got)
        return out


def _sections(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = [("", "")]
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^(#{1,4})\s+(.+?)\s*$", line)
        if m:
            out.append((m.group(2).strip(), ""))
        else:
            h, body = out[-1]
            out[-1] = (h, body + line + "\n")
    return out


def _text(html: str) -> str:
    t = re.sub(r"<br\s*/?>", " ", html)
    t = re.sub(r"<[^>]+>", "", t)
    return re.sub(r"\s+", " ", t.replace("\\_", "_")).strip()


def _apply_notes(text: str, by: dict[str, list[str]]) -> None:
    """`<term>Atlas 训练系列产品</term>：数据类型支持FLOAT、FLOAT16` / `数据类型不支持BFLOAT16`."""
    for m in _TERM_NOTE.finditer(text):
        note = m.group(2)
        if "数据类型" not in note and "dtype" not in note.lower():
            continue
        chips = {c for part in m.group(1).split("/") if (c := chip_of(part))}
        found = dtypes_in(note)
        if not chips or not found:
            continue
        for chip in chips:
            if "不支持" in note:
                base = by.get(chip, by.get("*", []))
                by[chip] = [d for d in base if d not in found]
            elif "支持" in note:
                by[chip] = found


def _params_from_table(body: str, params: dict[str, dict[str, list[str]]]) -> None:
    rows = _ROW.findall(body)
    col = -1
    for row in rows:
        cells = _CELL.findall(row)
        texts = [_text(c) for c in cells]
        if "数据类型" in texts:
            col = texts.index("数据类型")
            continue
        if not cells:
            continue
        m = _PARAM.match(texts[0])
        if not m:
            continue
        by = params.setdefault(m.group(1), {})
        if 0 <= col < len(cells):
            found = dtypes_in(texts[col])
            if found and "*" not in by:
                by["*"] = found
        _apply_notes(" ".join(cells), by)


def _params_from_bullets(body: str, params: dict[str, dict[str, list[str]]]) -> None:
    """Older docs: `- self（aclTensor*，计算输入）：... 数据类型支持FLOAT、FLOAT16 ...` with notes below."""
    current: dict[str, list[str]] | None = None
    for line in body.splitlines():
        m = _BULLET_PARAM.match(line)
        if m:
            current = params.setdefault(m.group(1), {})
            rest = m.group(2)
            dm = re.search(r"数据类型支持([^。；;]*)", rest)
            if dm and "*" not in current:
                found = dtypes_in(dm.group(1))
                if found:
                    current["*"] = found
            _apply_notes(rest, current)
        elif current is not None and "<term>" in line:
            _apply_notes(line, current)


def parse_aclnn_doc(text: str, filename: str = "") -> AclnnDoc | None:
    """None when the text is not an aclnn API doc."""
    secs = _sections(text)
    h1 = next((h for h, _ in secs if h.startswith("aclnn")), "")
    head = h1 or Path(filename).stem
    names = [n for n in _NAME.findall(head) if not _PHASE.search(n)]
    if not names:
        return None
    for _, body in secs:
        if "aclnnStatus" in body:
            for n in _NAME.findall(body):
                n = _PHASE.sub("", n)
                if n not in names and n != "aclnnStatus" and len(names) < 12:
                    names.append(n)
    doc = AclnnDoc(names=names, title=head.replace("&", " / "))
    first_errors = ""
    for heading, body in secs:
        h = heading
        if "产品支持" in h or "支持的产品" in h:
            for line in body.splitlines():
                m = re.search(r"<term>([^<]+)</term>\s*[：:]\s*(不支持|支持)", line)
                if m and (c := chip_of(m.group(1))):
                    doc.products[c] = m.group(2) == "支持"
                else:
                    m2 = re.match(r"^\s*[-*]\s*(Atlas[^：:]+|Ascend[^：:]+)[：:]?\s*(不支持|支持)?", line)
                    if m2 and (c := chip_of(m2.group(1))):
                        doc.products[c] = m2.group(2) != "不支持"
        elif h in ("功能说明", "功能描述"):
            doc.function = _text(clean(body))[:600]
        elif "约束" in h:
            doc.constraints = clean(body)[:2500]
        if "数据类型" in body:
            before = set(doc.params)
            _params_from_table(body, doc.params)
            _params_from_bullets(body, doc.params)
            # per-product notes below a table apply to the tensors of that section
            outside = re.sub(r"<table.*?</table>", "", body, flags=re.S)
            for p in set(doc.params) - before or set(doc.params):
                if "<table" in body:
                    _apply_notes(outside, doc.params[p])
        if not first_errors and ("161002" in body or "ACLNN_ERR_PARAM" in body):
            first_errors = _error_text(body)
    doc.errors = first_errors
    doc.params = {p: by for p, by in doc.params.items() if any(by.values())}
    return doc


def _error_text(body: str) -> str:
    """The parameter-error table of a first-phase section, as lines `161002 ACLNN_ERR_PARAM_INVALID: ...`."""
    lines: list[str] = []
    for row in _ROW.findall(body):
        cells = [_text(c) for c in _CELL.findall(row)]
        if cells and any(re.search(r"ACLNN_ERR|16100\d|56\d{4}", c) for c in cells):
            lines.append(" | ".join(c for c in cells if c))
        elif lines and cells and len(cells) == 1:
            lines[-1] += " ; " + cells[0]
    if not lines:
        m = re.search(r"(第一段接口.*?)(?=\n\s*\n\s*[-*#]|\Z)", body, re.S)
        if m:
            lines.append(_text(m.group(1)))
    return "\n".join(lines)[:2000]


def _dtype_summary(doc: AclnnDoc) -> str:
    parts = []
    for p, by in doc.params.items():
        general = by.get("*", [])
        s = f"{p}: {', '.join(general) or 'not listed'}"
        extra = [f"{CHIP_NAMES.get(c, c)}: {', '.join(v) or 'none'}" for c, v in by.items() if c != "*"]
        if extra:
            s += f" ({'; '.join(extra)})"
        parts.append(s)
    return "\n".join(parts)


def aclnn_chunks(
    doc: AclnnDoc, ops: list[str], *, root_key: str, rel: str, source: str, path: str, version: str = ""
) -> list[Chunk]:
    """Two chunks: what the op is and what it accepts (names, aten ops, products, dtypes), and
    the constraints with the parameter errors (an EZ1001/161002 message next to its cause)."""
    name_keys = [f"aclnn:{n.lower()}" for n in doc.names]
    op_keys = [f"op:{o}" for o in ops]
    primary = [*name_keys, *op_keys][:64]
    yes = [CHIP_NAMES[c] for c in CHIPS if doc.products.get(c)]
    no = [CHIP_NAMES[c] for c in CHIPS if doc.products.get(c) is False]
    head = f"{' / '.join(doc.names)}" + (f" (aten: {', '.join(ops)})" if ops else "")
    body = f"{head}\n{doc.function}\nSupported on: {', '.join(yes) or 'not listed'}"
    if no:
        body += f"; not supported on: {', '.join(no)}"
    summary = _dtype_summary(doc)
    if summary:
        body += f"\nDtypes per parameter:\n{summary}"
    dtypes_json = json.dumps(
        {"names": doc.names, "ops": ops, "products": doc.products, "params": doc.params},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    base = digest(root_key, rel)
    common: dict[str, Any] = {"source": source, "path": path, "version": version, "language": "zh"}
    chunks = [
        Chunk(
            id=f"{base}-0",
            collection="ascend_ops",
            title=f"{doc.title} (CANN operator reference)",
            text=body[:4000],
            embed_text=f"{head}: {doc.function}"[:300],
            anchor="",
            keys=primary,
            primary=primary,
            product=", ".join(yes)[:300],
            kind="aclnn",
            extra={"aclnn": dtypes_json[:30000]},
            **common,
        )
    ]
    if doc.constraints or doc.errors:
        text = f"{head}: constraints and parameter errors\n{doc.errors}\n\n{doc.constraints}".strip()
        keys = [*primary, *(k for k in extract_keys(text) if k not in primary)][:64]
        chunks.append(
            Chunk(
                id=f"{base}-1",
                collection="ascend_ops",
                title=f"{doc.title} > 约束说明 / errors",
                text=text[:4000],
                embed_text=f"{head} constraints errors: {doc.errors[:200]}"[:300],
                anchor="约束说明",
                keys=keys,
                primary=primary,
                product=", ".join(yes)[:300],
                kind="aclnn",
                **common,
            )
        )
    return chunks


def is_aclnn_doc_name(path: Path) -> bool:
    return re.match(r"aclnn[A-Z]", path.name) is not None and path.suffix.lower() == ".md"


# ---------------------------------------------------------------- dtype look-up for reports


@dataclass
class DtypeSupport:
    names: list[str]
    ops: list[str]
    chip: str | None
    supported_on_chip: bool | None
    dtypes: dict[str, list[str]]  # tensor parameter -> dtypes on the chip
    source: str

    def summary(self) -> str:
        where = CHIP_NAMES.get(self.chip or "", self.chip or "all chips")
        if self.supported_on_chip is False:
            return f"{'/'.join(self.names)} is not supported on {where} ({self.source})"
        ps = "; ".join(f"{p}: {', '.join(d)}" for p, d in self.dtypes.items())
        return f"{'/'.join(self.names)} on {where}: {ps} ({self.source})"
