"""Static hazard scan (DESIGN §7; the hazard classes of agents/rules/registry.py) of a model's source tree with libcst.

One parse per file, one traversal that indexes the nodes the rules need (agents/rules/context.py), then
each hazard rule's detector (agents/rules/h*.py, listed in agents/rules/registry.py) reads that index.
Every finding carries exact ``file:line:col`` evidence and its rule's knowledge-base citation
(``recipe:H<n>``); whether it is ``fixable`` comes from the rule's fixes, the same table the rule policy
applies. The knowledge base adds more citations later.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Iterator
from pathlib import Path

import libcst as cst
from pydantic import BaseModel, Field

from agents.models import Finding
from agents.rules.base import Registry
from agents.rules.context import ModuleContext, TextFile
from agents.rules.registry import active
from knowledge.errors import SourceSyntaxError
from sandbox.isolation.source_check import decode_source

# Directories never scanned; files we read as text (not Python).
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".tox", ".nox", "node_modules",
             "site-packages", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", ".eggs"}
MAX_FILE_BYTES = 2_000_000
DEFAULT_INCLUDE = ["*.py", "requirements*.txt", "README*.md", "*.sh", "*.cu", "*.cuh", "config.json"]


# ----------------------------------------------------------------------------------------------
# Result records
# ----------------------------------------------------------------------------------------------

class ParseError(BaseModel):
    """A file the scan could not parse; reported, never raised."""

    file: str
    line: int
    col: int = 0
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class SkippedPath(BaseModel):
    path: str
    reason: str


class ScanResult(BaseModel):
    root: str
    findings: list[Finding] = Field(default_factory=list)  # sorted by (file, line, col)
    files: list[str] = Field(default_factory=list)  # files scanned (posix, relative to root)
    parse_errors: list[ParseError] = Field(default_factory=list)
    skipped: list[SkippedPath] = Field(default_factory=list)
    test_files: list[str] = Field(default_factory=list)  # scanned, but tests rather than model code

    def by_hazard(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.hazard, []).append(f)
        return out

    def hazards(self) -> set[str]:
        return {f.hazard for f in self.findings}

    def model_findings(self) -> list[Finding]:
        """Findings outside test files."""
        tests = set(self.test_files)
        return [f for f in self.findings if f.file not in tests]


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def scan_source(source: str, path: str, registry: Registry | None = None) -> list[Finding]:
    """Findings for one Python source text; raises SourceSyntaxError when it does not parse."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        # CPython's own message and line are what the user knows; libcst's point past the error
        try:
            ast.parse(source, filename=path)
        except SyntaxError as py_exc:
            raise SourceSyntaxError(path, py_exc.lineno or exc.raw_line, max((py_exc.offset or 1) - 1, 0),
                                    py_exc.msg) from exc
        raise SourceSyntaxError(path, exc.raw_line, exc.raw_column,
                                f"libcst cannot parse this file: {exc.message}") from exc
    reg = registry or active()
    ctx = ModuleContext(path, source, module, reg)
    for rule in reg.rules:
        if rule.detect is not None:
            rule.detect(ctx)
    return _dedupe_sorted(ctx.findings)


def _scan_text(tf: TextFile, reg: Registry) -> list[Finding]:
    return [f for rule in reg.rules if rule.detect_text is not None for f in rule.detect_text(tf)]


def scan_tree(root: Path, *, include: list[str] | None = None, registry: Registry | None = None) -> ScanResult:
    """Scan every Python (and requirements / README / shell) file under root.

    include: glob patterns matched against the posix path relative to root and against the
    file name; default: Python, requirements*.txt, README*.md, *.sh, CUDA sources and config.json.
    """
    reg = registry or active()
    root = Path(root)
    patterns = include or DEFAULT_INCLUDE
    result = ScanResult(root=str(root))
    findings: list[Finding] = []
    sources: dict[str, str] = {}  # every Python file, for the rules' tree-level passes
    for path, rel in _walk(root, result.skipped):
        if not any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(path.name, p) for p in patterns):
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            result.skipped.append(SkippedPath(path=rel, reason=f"larger than {MAX_FILE_BYTES} bytes"))
            continue
        try:  # Python files as Python reads them (PEP 263 coding cookie), the rest as UTF-8
            text = decode_source(path.read_bytes()) if path.suffix == ".py" else path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, SyntaxError):
            result.skipped.append(SkippedPath(path=rel, reason="not UTF-8 text (and no PEP 263 encoding)"))
            continue
        result.files.append(rel)
        if _is_test_file(rel):
            result.test_files.append(rel)
        if path.suffix == ".py":
            sources[rel] = text
            try:
                findings.extend(scan_source(text, rel, reg))
            except SourceSyntaxError as exc:
                result.parse_errors.append(ParseError(file=exc.file, line=exc.line, col=exc.col, message=exc.message))
            if path.name == "setup.py":
                findings.extend(_scan_text(TextFile(rel, path.name, text, reg, kind="setup.py"), reg))
        elif path.suffix in (".cu", ".cuh"):
            findings.extend(_scan_text(TextFile(rel, path.name, text, reg, kind="cuda-source"), reg))
        elif path.name == "config.json":  # a model config: sizes (H6's MoE dispatch cost)
            findings.extend(_scan_text(TextFile(rel, path.name, text, reg, kind="model-config"), reg))
        else:
            findings.extend(_scan_text(TextFile(rel, path.name, text, reg), reg))
    for rule in reg.rules:
        if rule.refine is not None:
            findings = rule.refine(findings, sources)
    result.findings = _dedupe_sorted(findings)
    return result



def _walk(root: Path, skipped: list[SkippedPath]) -> Iterator[tuple[Path, str]]:
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(d.iterdir())
        except OSError as exc:
            skipped.append(SkippedPath(path=d.relative_to(root).as_posix() or ".", reason=str(exc)))
            continue
        for p in entries:
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                skipped.append(SkippedPath(path=rel, reason="symbolic link"))
            elif p.is_dir():
                if p.name in SKIP_DIRS or p.name.endswith(".egg-info"):
                    skipped.append(SkippedPath(path=rel, reason="tool or cache directory"))
                elif (p / "pyvenv.cfg").exists():
                    skipped.append(SkippedPath(path=rel, reason="virtual environment"))
                else:
                    stack.append(p)
            elif p.is_file():
                yield p, rel
        stack.sort(reverse=True)  # walk in name order, so results are stable


def _is_test_file(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return (any(p in ("tests", "test") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def _dedupe_sorted(findings: Iterable[Finding]) -> list[Finding]:
    seen: dict[str, Finding] = {}
    for f in findings:
        seen.setdefault(f.id, f)
    return sorted(seen.values(), key=lambda f: (f.file, f.line, f.col, int(f.hazard[1:]), f.rule))
