"""Optional: per-API support tables and dtype limits from torch_npu's native-API docs folder.

The folder (e.g. ``native_api_2-13-0``) has one markdown file per torch module; each API is a
``### torch.xxx`` section with a product table (✔ / ✘) and a limits note such as
"`input` 仅支持 fp16, fp32" (only these dtypes). Only what parses cleanly is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_DTYPE_TOKENS = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": "float64",
    "uint8": "uint8",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
    "complex32": "complex32",
    "complex64": "complex64",
    "complex128": "complex128",
}
_SECTION_RE = re.compile(r"^###\s+(torch\.[A-Za-z0-9_.]+)\s*$", re.M)
_ROW_RE = re.compile(r"^\|\s*(?:<term>)?([^|<]+?)(?:</term>)?\s*\|\s*([✔✘])\s*\|", re.M)
_DTYPE_NOTE_RE = re.compile(r"`(\w+)`\s*仅支持\s*([A-Za-z0-9_，,\s]+)")
_FALLBACK_NOTE = "回退至CPU"  # "falls back to the CPU"
_LIMIT_MARK = "限制与说明"  # the limits-note label

# Python namespaces whose functions map to aten names with a prefix.
_PREFIX = {"torch.special.": "special_", "torch.linalg.": "linalg_", "torch.fft.": "fft_"}


@dataclass
class ApiDoc:
    api: str
    products: dict[str, bool] = field(default_factory=dict)
    dtypes: list[str] | None = None  # allow-list of the first tensor argument
    dtype_arg: str | None = None
    may_fall_back: bool = False


def parse_docs_dir(docs_dir: Path) -> dict[str, ApiDoc]:
    """API name -> what its section says. Unparseable sections are skipped, not guessed."""
    out: dict[str, ApiDoc] = {}
    for md in sorted(Path(docs_dir).glob("*.md")):
        text = md.read_text(encoding="utf-8", errors="replace")
        heads = list(_SECTION_RE.finditer(text))
        for i, h in enumerate(heads):
            body = text[h.end() : heads[i + 1].start() if i + 1 < len(heads) else len(text)]
            doc = _parse_section(h.group(1), body)
            if doc.products or doc.dtypes or doc.may_fall_back:
                out.setdefault(doc.api, doc)
    return out


def _parse_section(api: str, body: str) -> ApiDoc:
    doc = ApiDoc(api)
    for row in _ROW_RE.finditer(body):
        doc.products[row.group(1).strip()] = row.group(2) == "✔"
    limit = body[body.find(_LIMIT_MARK) :] if _LIMIT_MARK in body else ""
    m = _DTYPE_NOTE_RE.search(limit)
    if m:
        tokens = [t.strip() for t in re.split(r"[，,]", m.group(2)) if t.strip()]
        mapped = [_DTYPE_TOKENS.get(t.lower()) for t in tokens]
        if tokens and all(mapped):
            doc.dtypes = sorted({d for d in mapped if d})
            doc.dtype_arg = m.group(1)
    doc.may_fall_back = _FALLBACK_NOTE in limit
    return doc


def aten_base_name(api: str) -> str:
    """``torch.Tensor.add`` / ``torch.add`` -> ``add``; ``torch.special.erfcx`` -> ``special_erfcx``."""
    for prefix, aten_prefix in _PREFIX.items():
        if api.startswith(prefix):
            return aten_prefix + api[len(prefix) :]
    return api.rsplit(".", 1)[-1]


def docs_by_aten_name(docs: dict[str, ApiDoc], aten_names: set[str]) -> dict[str, ApiDoc]:
    """Aten base name -> its doc; ``torch.X`` wins over ``torch.Tensor.X`` and other spellings."""
    ranked = sorted(docs.values(), key=lambda d: (d.api.count("."), d.api))
    out: dict[str, ApiDoc] = {}
    for d in ranked:
        name = aten_base_name(d.api)
        if name in aten_names:
            out.setdefault(name, d)
    return out


# Custom ops the wheel documents (torch_npu/_op_plugin_docs.py registers a docstring per op).
DOCS_NAME_RE = re.compile(r"""_add_torch_npu_docstr\(\s*["']([A-Za-z0-9_.]+)["']""")


def documented_custom_ops(text: str | None) -> set[str]:
    return set(DOCS_NAME_RE.findall(text or ""))
