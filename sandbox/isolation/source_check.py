"""Does every Python file of a model folder read and parse? Checked before a port runs (exit 2).

One function, ``check_sources(folder) -> list[SourceProblem]``, with no npuport imports, so that it
can move as it stands into the limited parser subprocess (issue #29: untrusted source should not be
parsed in npuport's own process). Decoding follows Python's own rules (PEP 263: a BOM or a coding
cookie names the encoding, else UTF-8), so a file Python would run is never refused for its bytes.
"""

from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

# Folders that are not the model's code (tools, caches, environments); hidden folders never count.
SKIP_DIRS = frozenset({"__pycache__", "venv", "env", "node_modules", "site-packages"})
MAX_FILE_BYTES = 2_000_000  # the scanner's limit: bigger files are not the model's hand-written code


@dataclass(frozen=True)
class SourceProblem:
    file: str  # posix, relative to the folder
    line: int  # 0 when the whole file is the problem (its bytes)
    kind: str  # "encoding" | "syntax"
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.message}"


def decode_source(data: bytes) -> str:
    """The text of a Python file as Python reads it (PEP 263); raises SyntaxError (a bad or unknown
    declared encoding) or UnicodeDecodeError (bytes that are not in the encoding)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


def python_files(folder: Path) -> list[Path]:
    """The model's Python files: no hidden parts, no tool or environment folders, no links."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).parts
        if any(p.startswith(".") or p in SKIP_DIRS or p.endswith(".egg-info") for p in rel[:-1]):
            continue
        if rel[-1].startswith(".") or path.is_symlink() or not path.is_file():
            continue
        if any((folder.joinpath(*rel[:i]) / "pyvenv.cfg").exists() for i in range(1, len(rel))):
            continue
        out.append(path)
    return out


def _encoding_problem(data: bytes, rel: str, exc: SyntaxError | UnicodeDecodeError) -> SourceProblem:
    """Where the bytes stop being text: the first byte that is not in the file's encoding, or the bad
    coding cookie (detect_encoding raises SyntaxError for both in the first two lines)."""
    if isinstance(exc, SyntaxError):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as utf8:
            exc = utf8
        else:
            return SourceProblem(rel, exc.lineno or 0, "encoding", f"{exc.msg} (PEP 263)")
    line = data[:exc.start].count(b"\n") + 1
    return SourceProblem(rel, line, "encoding",
                         f"not valid {exc.encoding} (byte 0x{data[exc.start]:02x}); save it as UTF-8, "
                         "or declare its encoding in a '# -*- coding: NAME -*-' line (PEP 263)")


def check_file(path: Path, rel: str) -> SourceProblem | None:
    data = path.read_bytes()
    if len(data) > MAX_FILE_BYTES:
        return None
    try:
        text = decode_source(data)
    except (SyntaxError, UnicodeDecodeError) as exc:
        return _encoding_problem(data, rel, exc)
    try:
        compile(text, rel, "exec", flags=0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST: parse, never run
    except SyntaxError as exc:
        return SourceProblem(rel, exc.lineno or 1, "syntax", f"{type(exc).__name__}: {exc.msg}")
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, too deep to parse
        return SourceProblem(rel, 0, "syntax", f"cannot be parsed: {exc}")
    return None


def check_sources(folder: Path) -> list[SourceProblem]:
    """Every Python file of ``folder`` that cannot be read or parsed, in path order."""
    folder = Path(folder)
    problems = []
    for path in python_files(folder):
        if problem := check_file(path, path.relative_to(folder).as_posix()):
            problems.append(problem)
    return problems
