"""Reading text safely and cutting Markdown into chunks by heading / API.

Two shapes are handled:
- ordinary Markdown: one chunk per heading section (levels 1-3, code fences respected); small
  neighbouring sections are merged, long ones split at paragraphs;
- API support lists (Ascend native-API pages: per API a support table per product and an optional
  limits note): one compact chunk per API that has a limits note, and the plainly supported APIs of
  a section grouped into list chunks (their names stay searchable as identifier keys).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from knowledge.kb.identifiers import extract_keys

MIN_SECTION_CHARS = 500  # merge smaller neighbouring sections
MAX_CHUNK_CHARS = 3000  # split larger sections
EMBED_CHARS = 600  # embedding models truncate (MiniLM: 256 tokens); keep the head only
GROUP_SIZE = 40  # plainly supported APIs per list chunk


@dataclass
class Decoded:
    text: str
    note: str = ""  # how it was decoded when not plain UTF-8


def looks_binary(head: bytes) -> bool:
    return b"\x00" in head[:8192]


def decode(data: bytes) -> Decoded:
    """UTF-8, else GB18030 (Chinese docs), else UTF-8 with replacement characters."""
    try:
        return Decoded(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        pass
    try:
        return Decoded(data.decode("gb18030"), "not UTF-8: decoded as GB18030")
    except UnicodeDecodeError:
        return Decoded(data.decode("utf-8", errors="replace"), "not UTF-8: undecodable bytes replaced")


def detect_language(text: str) -> str:
    """'zh' when CJK characters make up a real share of the letters, else 'en'."""
    sample = text[:4000]
    cjk = sum(1 for c in sample if "\u4e00" <= c <= "\u9fff")
    latin = sum(1 for c in sample if c.isascii() and c.isalpha())
    return "zh" if cjk and cjk * 3 >= latin * 0.5 else "en"


_PRODUCTS = [
    ("Ascend 950", re.compile(r"Ascend\s*950\w*")),
    ("Atlas A3", re.compile(r"Atlas\s*A3")),
    ("Atlas A2", re.compile(r"Atlas\s*(?:800I\s*)?A2")),
    ("Atlas 300I/310P", re.compile(r"Atlas\s*300I|310P|Atlas\s*推理系列|Atlas inference series", re.I)),
    ("Atlas training (910)", re.compile(r"Atlas\s*训练系列产品|Atlas training series|910A?\b", re.I)),
]


def detect_products(text: str) -> str:
    return ", ".join(name for name, rx in _PRODUCTS if rx.search(text))


_VERSION_IN_PATH = re.compile(r"(\d+)[-_.](\d+)[-_.](\d+)")


def version_from_path(path: str) -> str:
    m = _VERSION_IN_PATH.search(path)
    return ".".join(m.groups()) if m else ""


def slug(heading: str) -> str:
    """GitHub-style anchor: lower case, punctuation dropped, spaces to dashes (CJK kept)."""
    s = re.sub(r"<[^>]+>", "", heading).strip().lower()
    s = re.sub(r"[^\w\- \u4e00-\u9fff]", "", s)
    return re.sub(r"\s", "-", s)


def digest(*parts: str) -> str:
    h = hashlib.sha1()
    for p in parts:
        h.update(p.encode("utf-8", "replace"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def clean(text: str) -> str:
    """Markup that only costs tokens: html tags, escapes, runs of blank lines."""
    text = re.sub(r"<br\s*/?>", " ", text)
    text = re.sub(r"</?(?:div|term|font|code|i|b|span|p|sup|sub)[^>]*>", "", text)
    text = text.replace("\\_", "_")
    return re.sub(r"\n{3,}", "\n\n", text).strip()


@dataclass
class Section:
    title: str  # "Doc title > heading"
    heading: str
    anchor: str
    level: int
    body: str
    keys: list[str] = field(default_factory=list)
    primary: list[str] = field(default_factory=list)
    embed: str = ""  # text to embed when not title + body


_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_PSEUDO_HEADING = re.compile(r"^>\s*<font[^>]*>(.+?)</font>\s*$")  # native-API Tensor pages


def _split_headings(text: str) -> list[tuple[int, str, list[str]]]:
    """[(level, heading, lines)] with a level-0 preamble; headings in code fences are code."""
    out: list[tuple[int, str, list[str]]] = [(0, "", [])]
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        m = None if in_fence else _HEADING.match(line)
        pm = None if in_fence or m else _PSEUDO_HEADING.match(line)
        if m:
            out.append((len(m.group(1)), m.group(2).strip(), []))
        elif pm:
            out.append((4, pm.group(1).strip(), []))
        else:
            out[-1][2].append(line)
    return out


def _is_api_list(text: str) -> bool:
    return text.count("**原生文档**") >= 3 or text.count("**Native doc**") >= 3


def markdown_sections(text: str, doc_name: str) -> list[Section]:
    """Sections of an ordinary Markdown document, merged and split to a useful size."""
    parts = _split_headings(text)
    doc_title = next((h for lvl, h, _ in parts if lvl == 1), doc_name)
    sections: list[Section] = []
    for level, heading, lines in parts:
        body = clean("\n".join(lines))
        if not body and level != 1:
            continue
        if heading in ("目录", "Contents", "Table of Contents"):
            continue
        title = doc_title if level <= 1 or heading == doc_title else f"{doc_title} > {clean(heading)}"
        sections.append(Section(title, clean(heading) or doc_title, slug(heading or doc_title), level, body))
    merged: list[Section] = []
    for s in sections:
        prev = merged[-1] if merged else None
        # merge small neighbours under one title: short sections alone embed poorly
        if (
            prev is not None
            and len(prev.body) < MIN_SECTION_CHARS
            and len(s.body) < MIN_SECTION_CHARS
            and s.level >= max(prev.level, 2)
        ):
            prev.body = f"{prev.body}\n\n## {s.heading}\n{s.body}".strip()
            continue
        merged.append(s)
    out: list[Section] = []
    for s in merged:
        for i, piece in enumerate(_split_long(s.body)):
            title = s.title if i == 0 else f"{s.title} ({i + 1})"
            out.append(Section(title, s.heading, s.anchor, s.level, piece))
    for s in out:
        s.primary = extract_keys(s.title)
        s.keys = _merge_keys(s.primary, extract_keys(s.body))
    return [s for s in out if len(re.sub(r"\W", "", s.body)) >= 10 or s.primary]


def _split_long(body: str) -> list[str]:
    if len(body) <= MAX_CHUNK_CHARS:
        return [body]
    pieces: list[str] = []
    cur = ""
    for para in re.split(r"\n\s*\n", body):
        if cur and len(cur) + len(para) > MAX_CHUNK_CHARS:
            pieces.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
        while len(cur) > MAX_CHUNK_CHARS * 2:  # one giant paragraph (a table): hard cut
            pieces.append(cur[:MAX_CHUNK_CHARS])
            cur = cur[MAX_CHUNK_CHARS:]
    if cur:
        pieces.append(cur)
    return pieces


def _merge_keys(*lists: list[str]) -> list[str]:
    out: list[str] = []
    for lst in lists:
        for k in lst:
            if k not in out:
                out.append(k)
    return out[:64]


_NATIVE_LINK = re.compile(r"\*\*(?:原生文档|Native doc)\*\*[:：]\s*\[([^\]]+)\]\(([^)]+)\)")
_LIMIT = re.compile(r"\*\*(?:限制与说明|Limits?)\*\*[:：]\s*(.+?)(?=\n\s*\n|\n</div>|\Z)", re.S)
_ROW = re.compile(r"^\|\s*(.+?)\s*\|\s*([✔✘√×])\s*\|\s*$", re.M)


def _api_name(heading: str, link_text: str, module: str) -> str:
    name = clean(heading)
    name = re.sub(r"^(?:class\s+)?", "", re.sub(r"<[^>]+>", "", name)).strip()
    if link_text and "." in link_text:
        name = link_text
    if module and not name.startswith(("torch", "Tensor")) and "." not in name:
        name = f"{module}.{name}"
    return name.strip()


def api_list_sections(text: str, doc_name: str) -> list[Section]:
    """Native-API support pages: compact per-API chunks and grouped plain-support lists."""
    parts = _split_headings(text)
    doc_title = next((h for lvl, h, _ in parts if lvl == 1), doc_name)
    module = doc_title.strip()
    out: list[Section] = []
    group: list[str] = []
    group_section = ""

    def flush() -> None:
        nonlocal group
        if group:
            names = ", ".join(group)
            title = f"{doc_title} > {group_section}: supported APIs without limits"
            body = f"Supported with no NPU-specific limits: {names}"
            keys = _merge_keys(*(extract_keys(n.split(" (")[0]) for n in group))
            # the listed APIs are what the chunk is about: they are its primary keys
            out.append(Section(title, group_section, slug(group_section), 2, body, keys, keys))
            group = []

    for level, heading, lines in parts:
        raw = "\n".join(lines)
        link = _NATIVE_LINK.search(raw)
        if level <= 2 and not link:
            flush()
            group_section = clean(heading) or doc_title
            continue
        if not link:
            continue
        name = _api_name(heading, link.group(1), module)
        rows = [(clean(p), ok in "✔√") for p, ok in _ROW.findall(raw) if p.strip("- :")]
        yes = [p for p, ok in rows if ok]
        no = [p for p, ok in rows if not ok]
        limit = _LIMIT.search(raw)
        if limit is None:
            # no limits note: a list entry is enough (the name stays an identifier key)
            group.append(f"{name} (not on {', '.join(no)})" if no else name)
            if len(group) >= GROUP_SIZE:
                flush()
            continue
        body = f"{name}: supported on {', '.join(yes) or 'none listed'}"
        if no:
            body += f"; not supported on {', '.join(no)}"
        body += f". Limits: {clean(limit.group(1))}"
        keys = _merge_keys(extract_keys(name), extract_keys(limit.group(1)))
        body += f"\nPyTorch doc: {link.group(2)}"
        sec = Section(f"{doc_title} > {name}", name, slug(heading), 3, body, keys, extract_keys(name))
        sec.embed = f"{name}. Limits: {clean(limit.group(1))}"  # the product list carries no meaning
        out.append(sec)
    flush()
    return out


def sections_for(text: str, doc_name: str) -> list[Section]:
    return api_list_sections(text, doc_name) if _is_api_list(text) else markdown_sections(text, doc_name)
