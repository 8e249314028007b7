"""Source specs -> source units (one per file), each with a content hash and a deferred chunk loader.

Spec forms (see docs/knowledge-base.md):
  PATH                 a docs folder (or one file); files under a folder named like "vllm*" go to "serving"
  docs:PATH            a docs folder for "ascend_ops";  serving:PATH  a docs folder for "serving"
  wheel:2.13.0         the torch_npu wheel of that version (cache, else `pip download`)
  wheel:PATH.whl       a downloaded wheel;  wheel:installed  the installed torch_npu (not imported)
  site:DIR             a site-packages folder holding torch_npu/
  matrix:PATH.json     an op-support matrix (docs/architecture.md); a bare *.json path works too
  recipes              our hazard recipes (always added by KnowledgeBase.build)
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from knowledge.errors import KBError
from knowledge.kb.aclnn import AtenMap, aclnn_chunks, is_aclnn_doc_name, load_aten_map, parse_aclnn_doc
from knowledge.kb.chunking import (
    EMBED_CHARS,
    clean,
    decode,
    detect_language,
    detect_products,
    digest,
    looks_binary,
    sections_for,
    version_from_path,
)
from knowledge.kb.identifiers import extract_keys, op_key
from knowledge.kb.matrix_chunks import matrix_chunks
from knowledge.kb.models import Chunk, Collection, SkippedFile
from knowledge.settings import settings

DOC_SUFFIXES = (".md", ".markdown", ".txt", ".rst")
OP_DOCS_MEMBER = "torch_npu/_op_plugin_docs.py"
# Bump when chunking changes: stored files are then re-chunked although their content is the same.
CHUNKER_VERSION = 3
# Public doc repositories `npuport kb build` with no arguments reads when the network allows.
DEFAULT_DOC_REPOS = (
    "https://github.com/hicann/ops-math.git",
    "https://github.com/hicann/ops-nn.git",
    "https://github.com/hicann/ops-transformer.git",
)


@dataclass
class SourceUnit:
    key: str  # stable identity in the manifest
    root: str  # the spec it came from: files of a root that disappear are pruned
    path: str
    sha256: str
    collection: Collection
    load: Callable[[], tuple[list[Chunk], str]]  # -> (chunks, note)


@dataclass
class Resolved:
    units: list[SourceUnit] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)  # roots whose listing is complete (prunable)
    skipped: list[SkippedFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # op-plugin tables / op matrices: map aclnn names of the CANN reference to aten ops
    map_yaml: list[Path] = field(default_factory=list)
    map_matrices: list[Path] = field(default_factory=list)
    map_texts: list[tuple[str, str]] = field(default_factory=list)  # (where, yaml text) from a wheel
    _amap: AtenMap | None = None
    # larger files are skipped (NPUPORT_KB_MAX_FILE_BYTES, read once per resolve)
    max_file_bytes: int = field(default_factory=lambda: settings().kb_max_file_bytes)

    def aten_map(self) -> AtenMap:
        if self._amap is None:
            self._amap = load_aten_map(self.map_yaml, self.map_matrices, self.map_texts)
        return self._amap


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _embed_text(title: str, body: str) -> str:
    return f"{title}\n{body}"[:EMBED_CHARS]


# ---------------------------------------------------------------- docs folders


def _collection_for(path: Path, default: Collection) -> Collection:
    if default != "ascend_ops":
        return default
    return "serving" if any("vllm" in part.lower() for part in path.parts) else default


def _doc_unit(file: Path, root: Path, root_key: str, collection: Collection, data: bytes) -> SourceUnit:
    rel = file.relative_to(root).as_posix() if file != root else file.name
    source = f"{root.name}/{rel}" if file != root else file.name
    col = _collection_for(Path(root.name) / rel, collection)

    def load() -> tuple[list[Chunk], str]:
        dec = decode(data)
        version = version_from_path(str(file))
        chunks: list[Chunk] = []
        for i, s in enumerate(sections_for(dec.text, file.stem)):
            chunks.append(
                Chunk(
                    id=f"{digest(root_key, rel)}-{i}",
                    collection=col,
                    title=s.title,
                    text=s.body,
                    embed_text=s.embed[:EMBED_CHARS] or _embed_text(s.title, s.body),
                    source=source,
                    path=str(file),
                    anchor=s.anchor,
                    keys=s.keys,
                    primary=s.primary,
                    version=version,
                    product=detect_products(s.body),
                    language=detect_language(s.title + "\n" + s.body),
                    kind="api" if s.level == 3 and s.primary else "doc",
                )
            )
        return chunks, (f"{file}: {dec.note}" if dec.note else "")

    return SourceUnit(f"{root_key}::{rel}", root_key, str(file), sha256_bytes(data), col, load)


def _aclnn_unit(file: Path, root: Path, root_key: str, data: bytes, out: Resolved) -> SourceUnit:
    """One CANN operator doc: parsed, keyed by its aclnn names and their aten ops."""
    rel = file.relative_to(root).as_posix() if file != root else file.name
    source = f"{root.name}/{rel}" if file != root else file.name
    names = re.findall(r"aclnn[A-Z][A-Za-z0-9]*", file.stem)
    amap = out.aten_map()
    # the mapping is part of the content: new op-plugin tables re-key the doc
    sha = sha256_bytes(data + amap.digest(names).encode())

    plain = _doc_unit(file, root, root_key, "ascend_ops", data)

    def load() -> tuple[list[Chunk], str]:
        dec = decode(data)
        doc = parse_aclnn_doc(dec.text, file.name)
        if doc is None:  # not shaped like an API page: ordinary Markdown chunks
            return plain.load()
        ops = amap.ops_for(doc.names)
        return aclnn_chunks(doc, ops, root_key=root_key, rel=rel, source=source, path=str(file)), ""

    return SourceUnit(f"{root_key}::{rel}", root_key, str(file), sha, "ascend_ops", load)


def _read_checked(file: Path, out: Resolved) -> bytes | None:
    try:
        size = file.stat().st_size
        if size > out.max_file_bytes:
            out.skipped.append(
                SkippedFile(path=str(file), reason=f"too large ({size} bytes > {out.max_file_bytes})")
            )
            return None
        data = file.read_bytes()
    except OSError as e:
        out.skipped.append(SkippedFile(path=str(file), reason=f"unreadable: {e.strerror or e}"))
        return None
    if looks_binary(data):
        out.skipped.append(SkippedFile(path=str(file), reason="binary content"))
        return None
    return data


def resolve_folder(root: Path, collection: Collection, out: Resolved) -> None:
    root = root.resolve()
    root_key = f"docs:{root}"
    files = (
        [root]
        if root.is_file()
        else sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts)
    )
    if root.is_dir():
        out.roots.append(root_key)
    n = 0
    for f in files:
        if f.suffix.lower() == ".json" and f != root:
            _maybe_matrix(f, out, quiet=True)
            continue
        if f.name.startswith("op_plugin_functions") and f.suffix in (".yaml", ".yml"):
            out.map_yaml.append(f)
            continue
        if f.suffix.lower() not in DOC_SUFFIXES and f != root:
            continue
        data = _read_checked(f, out)
        if data is None:
            continue
        base = root if root.is_dir() else f
        if collection == "ascend_ops" and is_aclnn_doc_name(f):
            out.units.append(_aclnn_unit(f, base, root_key, data, out))
        else:
            out.units.append(_doc_unit(f, base, root_key, collection, data))
        n += 1
    if n == 0:
        out.notes.append(f"{root}: no Markdown or text documents found (empty folder?)")


# ---------------------------------------------------------------- torch_npu wheel


@dataclass
class OpDoc:
    name: str
    doc: str


def parse_op_plugin_docs(source: str) -> list[OpDoc]:
    """`_add_torch_npu_docstr("name", \"\"\"doc\"\"\")` calls in _op_plugin_docs.py, read as text (no import)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))  # "\_" in their docstrings
            tree = ast.parse(source)
    except SyntaxError as e:
        raise KBError(f"{OP_DOCS_MEMBER} does not parse as Python ({e}); is the wheel damaged?") from e
    docs: list[OpDoc] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2):
            continue
        fn = node.func
        fname = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        if not fname.startswith("_add_") or "docstr" not in fname:
            continue
        a, b = node.args[0], node.args[1]
        if isinstance(a, ast.Constant) and isinstance(b, ast.Constant) and isinstance(a.value, str):
            docs.append(OpDoc(a.value, str(b.value)))
    return docs


def find_wheel(version: str) -> Path:
    """A cached torch_npu wheel of ``version`` (NPUPORT_WHEEL_CACHE or <home>/wheels), else `pip download`.

    Shares knowledge.wheel's cache and download so the op matrix and the knowledge base read one file.
    """
    from knowledge.errors import WheelError
    from knowledge.wheel import cached_wheel, download_wheel

    found = cached_wheel(version)
    if found is not None:
        return found
    try:
        return download_wheel(version)
    except WheelError as e:
        raise KBError(f"torch_npu {version} wheel not available: {e}") from e


def _wheel_version(name: str) -> str:
    m = re.match(r"torch_npu-([^-]+)", name)
    return m.group(1) if m else ""


def _wheel_doc_unit(text: str, version: str, where: str, out: Resolved) -> None:
    root_key = f"wheel:torch_npu=={version or 'unknown'}"
    data = text.encode("utf-8")
    source = f"torch_npu-{version}/{OP_DOCS_MEMBER}" if version else OP_DOCS_MEMBER

    def load() -> tuple[list[Chunk], str]:
        chunks: list[Chunk] = []
        for i, d in enumerate(parse_op_plugin_docs(text)):
            body = clean(d.doc)
            title = f"torch_npu.{d.name}"
            primary = [op_key(d.name)]
            keys = [*primary, *(k for k in extract_keys(body) if k not in primary)][:64]
            chunks.append(
                Chunk(
                    id=f"{digest(root_key, d.name)}-{i}",
                    collection="ascend_ops",
                    title=title,
                    text=body[:8000],
                    embed_text=_embed_text(title, body),
                    source=source,
                    path=where,
                    anchor=d.name,
                    keys=keys,
                    primary=primary,
                    version=version,
                    product=detect_products(body),
                    language=detect_language(body),
                    kind="wheel_doc",
                )
            )
        return chunks, ""

    out.units.append(
        SourceUnit(f"{root_key}::{OP_DOCS_MEMBER}", root_key, where, sha256_bytes(data), "ascend_ops", load)
    )


CODEGEN_MEMBER = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"


def resolve_wheel_file(whl: Path, out: Resolved) -> None:
    try:
        with zipfile.ZipFile(whl) as z:
            text = z.read(OP_DOCS_MEMBER).decode("utf-8", errors="replace")
            if CODEGEN_MEMBER in z.namelist():
                # every op with an NPU kernel in this build: validates aclnn -> aten names
                out.map_texts.append((f"{whl}!/{CODEGEN_MEMBER}", z.read(CODEGEN_MEMBER).decode("utf-8", "replace")))
    except KeyError:
        out.skipped.append(SkippedFile(path=str(whl), reason=f"no {OP_DOCS_MEMBER} in this wheel"))
        return
    except (OSError, zipfile.BadZipFile) as e:
        out.skipped.append(SkippedFile(path=str(whl), reason=f"unreadable wheel: {e}"))
        return
    _wheel_doc_unit(text, _wheel_version(whl.name), f"{whl}!/{OP_DOCS_MEMBER}", out)


def resolve_site(site: Path, out: Resolved) -> None:
    """An installed torch_npu: read its files, never import it (it needs CANN)."""
    pkg = site / "torch_npu" if (site / "torch_npu").is_dir() else site
    docs = pkg / "_op_plugin_docs.py"
    if not docs.is_file():
        out.skipped.append(
            SkippedFile(path=str(site), reason=f"no torch_npu/_op_plugin_docs.py under {site}")
        )
        return
    version = ""
    for info in sorted(pkg.parent.glob("torch_npu-*.dist-info")):
        version = _wheel_version(info.name)
    data = _read_checked(docs, out)
    if data is not None:
        _wheel_doc_unit(decode(data).text, version, str(docs), out)


def resolve_wheel(spec: str, out: Resolved) -> None:
    arg = spec[len("wheel:") :]
    if arg == "installed":
        found = importlib.util.find_spec("torch_npu")  # locates, does not execute the package
        if found is None or not found.submodule_search_locations:
            out.skipped.append(SkippedFile(path=spec, reason="torch_npu is not installed here"))
            return
        resolve_site(Path(next(iter(found.submodule_search_locations))), out)
    elif arg.endswith(".whl") or Path(arg).is_file():
        resolve_wheel_file(Path(arg).expanduser(), out)
    else:
        resolve_wheel_file(find_wheel(arg), out)


# ---------------------------------------------------------------- op-support matrix


def _maybe_matrix(path: Path, out: Resolved, quiet: bool = False) -> None:
    data = _read_checked(path, out)
    if data is None:
        return
    try:
        matrix = json.loads(decode(data).text)
    except json.JSONDecodeError as e:
        if not quiet:
            out.skipped.append(SkippedFile(path=str(path), reason=f"not JSON: {e}"))
        return
    if not (isinstance(matrix, dict) and isinstance(matrix.get("ops"), dict)):
        if not quiet:
            out.skipped.append(SkippedFile(path=str(path), reason="not an op-support matrix (no 'ops')"))
        return
    root_key = f"matrix:{path.resolve()}"
    out.map_matrices.append(path)

    def load() -> tuple[list[Chunk], str]:
        return matrix_chunks(matrix, root_key, str(path)), ""

    out.units.append(SourceUnit(root_key, root_key, str(path), sha256_bytes(data), "ascend_ops", load))


# ---------------------------------------------------------------- dispatch


def is_git_url(spec: str) -> bool:
    s = spec.removeprefix("git:")
    return s.startswith(("https://", "http://", "git@", "ssh://")) or (spec.startswith("git:") and bool(s))


def clone_cached(url: str, home: Path | None = None, timeout_s: float = 600) -> tuple[Path, str]:
    """A shallow clone of ``url`` under `<NPUPORT_HOME>/cache/git/`, refreshed when the network allows.

    Returns (folder, note). Offline with a cached clone: the cache and a note; offline without one:
    KBError saying what to do.
    """
    import subprocess

    from knowledge.home import npuport_home

    url = url.removeprefix("git:")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", re.sub(r"^\w+://|\.git$", "", url)).strip("_")
    dest = (home or npuport_home()) / "cache" / "git" / name
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    if (dest / ".git").is_dir():
        r = subprocess.run(
            ["git", "-C", str(dest), "pull", "--ff-only", "--depth", "1", "-q"],
            capture_output=True, text=True, timeout=timeout_s, env=env, check=False,
        )
        if r.returncode != 0:
            return dest, f"{url}: could not refresh ({r.stderr.strip()[:200]}); using the cached clone {dest}"
        return dest, ""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(
            ["git", "clone", "--depth", "1", "-q", url, str(dest)],
            capture_output=True, text=True, timeout=timeout_s, env=env, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KBError(f"Cannot clone {url} ({e}). Offline? Clone it elsewhere and pass the folder.") from e
    if r.returncode != 0:
        raise KBError(
            f"Cannot clone {url}: {r.stderr.strip()[:300] or 'git failed'}. Offline? "
            "Clone it where the network allows and pass the folder with --source PATH."
        )
    return dest, ""


def resolve(specs: list[str], *, strict: bool = False, optional: tuple[str, ...] = ()) -> Resolved:
    """Specs -> units. ``strict``: a named source that is missing or cannot be fetched raises
    KBError (the CLI); ``optional`` specs (the defaults) only leave a note when unavailable."""
    out = Resolved()
    specs = [s.strip() for s in specs if s.strip()]
    # op-plugin tables and matrices first: the CANN reference docs are keyed through them
    for spec in specs:
        p = Path(spec.removeprefix("opplugin:").removeprefix("matrix:")).expanduser()
        if spec.startswith("opplugin:") or (p.is_file() and p.suffix in (".yaml", ".yml")):
            if p.is_file():
                out.map_yaml.append(p)
            elif p.is_dir():
                out.map_yaml.extend(sorted(p.glob("op_plugin_functions*.yaml")))
        elif (spec.startswith("matrix:") or p.suffix == ".json") and p.is_file():
            out.map_matrices.append(p)
    for spec in specs:
        try:
            _resolve_one(spec, out)
        except KBError as e:
            if strict and spec not in optional:
                raise
            out.notes.append(f"{spec}: not used ({e})")
    if strict:
        bad = [s for s in out.skipped if s.reason == "not found" and s.path not in optional]
        if bad:
            raise KBError(f"Source not found: {', '.join(s.path for s in bad)}")
    return out


def _resolve_one(spec: str, out: Resolved) -> None:
    if spec.startswith("opplugin:") or spec.endswith((".yaml", ".yml")):
        return
    if is_git_url(spec):
        folder, note = clone_cached(spec)
        if note:
            out.notes.append(note)
        resolve_folder(folder, "ascend_ops", out)
        return
    if spec.startswith("wheel:"):
        resolve_wheel(spec, out)
        return
    if spec.startswith("site:"):
        resolve_site(Path(spec[5:]).expanduser(), out)
        return
    collection: Collection = "ascend_ops"
    path_s = spec
    for prefix, col in (("docs:", "ascend_ops"), ("serving:", "serving"), ("matrix:", "")):
        if spec.startswith(prefix):
            path_s = spec[len(prefix) :]
            if col:
                collection = col  # type: ignore[assignment]
    path = Path(path_s).expanduser()
    if not path.exists():
        out.skipped.append(SkippedFile(path=spec, reason="not found"))
    elif spec.startswith("matrix:") or (path.is_file() and path.suffix == ".json"):
        _maybe_matrix(path, out)
    elif path.is_file() and path.suffix == ".whl":
        resolve_wheel_file(path, out)
    elif path.is_dir() and (path / "torch_npu" / "_op_plugin_docs.py").is_file():
        resolve_site(path, out)
    else:
        resolve_folder(path, collection, out)
