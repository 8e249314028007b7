"""The scanner's view of one file: a per-module index that the hazard detectors read, and the text
files' lines (requirements, README pip lines, shell scripts).

One walk over the libcst tree indexes the nodes the rules need (calls, dotted references, strings,
imports, loops, ...); detectors add findings through ``ModuleContext.add``, which asks the registry
whether the finding is fixable, so the flag cannot disagree with the rule policy.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from agents.models import Finding, HazardCategory, Severity
from agents.rules.cst_helpers import (
    aliases,
    children,
    dotted,
    last_name,
    root_name,
    string_value,
    walk_nodes,
)
from agents.rules.flow import Flow


class FindingMaker(Protocol):
    """What a detector's context asks the registry (agents/rules/base.py's Registry provides it): a
    finding, checked against the rule that declares it."""

    def finding(self, hazard: str, rule: str, file: str, line: int, col: int, snippet: str, message: str,
                category: HazardCategory, severity: Severity, fixable: bool = True) -> Finding: ...

HOT_FUNCTION_RE = re.compile(r"^(_?forward\w*|generate\w*|__call__|_?decode\w*|_?sample\w*|prefill\w*|step)$")


@dataclass
class Ref:
    """The outermost Name/Attribute of a dotted chain, with its import-resolved name."""

    node: cst.Name | cst.Attribute
    qual: str


@dataclass
class ModuleContext:
    path: str
    source: str
    module: cst.Module
    registry: FindingMaker
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.positions = _positions(self.module)
        self.lines = self.source.splitlines()
        self.ix = _Indexer(self.module)
        self.aliases = aliases(self.ix.imports)
        self.refs = [Ref(n, self.qualify(dotted(n) or "")) for n in self.ix.chains]
        self._flow: Flow | None = None
        self._fallback_devices: list[cst.CSTNode] | None = None
        self._hot: set[str] | None = None

    # --- names --------------------------------------------------------------------------------
    def qualify(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        full = self.aliases.get(head)
        if full is None:
            return dotted
        return f"{full}.{rest}" if rest else full

    def qual(self, node: cst.CSTNode) -> str:
        d = dotted(node)
        return self.qualify(d) if d else ""

    def is_module_ref(self, node: cst.CSTNode) -> bool:
        """True when node is (a dotted path under) an imported name: `torch`, `F`, `np.linalg`."""
        d = dotted(node)
        return d is not None and d.partition(".")[0] in self.aliases

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.ix.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
        """(ancestor, child-on-the-path) pairs, innermost first."""
        child = node
        p = self.parent(node)
        while p is not None:
            yield p, child
            child, p = p, self.parent(p)

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for a, _ in self.ancestors(node):
            if isinstance(a, cst.FunctionDef):
                return a
        return None

    def in_hot_path(self, node: cst.CSTNode) -> str | None:
        """Name of the enclosing function when it runs per forward step: forward/generate-like, or
        called (by name, within this file) from one."""
        if self._hot is None:
            self._hot = _hot_functions(self)
        fn = self.function_of(node)
        while fn is not None:
            if fn.name.value in self._hot:
                return fn.name.value
            fn = self.function_of(fn)
        return None

    # --- findings -----------------------------------------------------------------------------
    def pos(self, node: cst.CSTNode) -> tuple[int, int]:
        r: CodeRange = self.positions[node]
        return r.start.line, r.start.column

    def add(self, hazard: str, rule: str, node: cst.CSTNode, message: str, category: HazardCategory,
            severity: Severity, fixable: bool = True) -> None:
        line, col = self.pos(node)
        snippet = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(self.registry.finding(hazard, rule, self.path, line, col, snippet, message, category,
                                                   severity, fixable))

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # --- shared analyses ----------------------------------------------------------------------
    @property
    def flow(self) -> Flow:
        if self._flow is None:
            self._flow = Flow(self)
            self._flow.run()
        return self._flow

    @property
    def fallback_devices(self) -> list[cst.CSTNode]:
        """If / IfExp nodes of the idiom `"cuda" if torch.cuda.is_available() else "cpu"`."""
        if self._fallback_devices is None:
            self._fallback_devices = find_device_fallbacks(self)
        return self._fallback_devices


def _positions(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """PositionProvider metadata for every node of module.

    MetadataWrapper.resolve also runs an (empty) batched visitor over the whole tree, which
    doubles the cost on a large model; the provider's own pass is all PositionProvider needs.
    """
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    gen = getattr(PositionProvider(), "_gen", None)
    if gen is not None:
        try:
            return cast(Mapping[cst.CSTNode, CodeRange], gen(wrapper))
        except TypeError:  # a libcst whose internals changed: take the public road
            pass
    return wrapper.resolve(PositionProvider)


class _Indexer:
    """One walk over the tree: parents plus the node lists the rules read.

    Walks dataclass fields directly rather than through libcst's visitor machinery, which
    rebuilds every node and costs several times more on a 2,000-line model.
    """

    def __init__(self, module: cst.Module) -> None:
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.calls: list[cst.Call] = []
        self.chains: list[cst.Name | cst.Attribute] = []  # outermost dotted chains (not in imports)
        self.load_names: Counter[str] = Counter()  # names used (not bound by import/def/param/keyword)
        self.strings: list[cst.SimpleString | cst.FormattedString] = []
        self.imports: list[cst.Import | cst.ImportFrom] = []
        self.fors: list[cst.For] = []
        self.functions: list[cst.FunctionDef] = []
        self.args: list[cst.Arg] = []  # keyword arguments
        self.statements: list[cst.CSTNode] = []  # small statements, for the dataflow
        self._walk(module)

    def _walk(self, root: cst.CSTNode) -> None:
        stack = [root]
        parents = self.parents
        while stack:
            node = stack.pop()
            if self._index(node):
                kids = children(node)
                for c in kids:
                    parents[c] = node
                stack.extend(reversed(kids))

    def _index(self, node: cst.CSTNode) -> bool:
        """Record node; False when its children need no walk."""
        if isinstance(node, cst.Import | cst.ImportFrom):
            self.imports.append(node)
            return False  # names in imports are bindings, read from the import node itself
        if isinstance(node, cst.Call):
            self.calls.append(node)
        elif isinstance(node, cst.Name | cst.Attribute):
            self._index_name(node)
        elif isinstance(node, cst.SimpleString | cst.FormattedString):
            self.strings.append(node)
        elif isinstance(node, cst.For):
            self.fors.append(node)
        elif isinstance(node, cst.FunctionDef):
            self.functions.append(node)
        elif isinstance(node, cst.Arg):
            if node.keyword is not None:
                self.args.append(node)
        elif isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign | cst.Expr | cst.Return):
            self.statements.append(node)
        return True

    def _index_name(self, node: cst.Name | cst.Attribute) -> None:
        parent = self.parents.get(node)
        if isinstance(parent, cst.Attribute) and (parent.attr is node or parent.value is node):
            return  # part of a longer chain, indexed with it
        if isinstance(node, cst.Name):
            if isinstance(parent, cst.Arg) and parent.keyword is node:
                return
            if isinstance(parent, cst.Param | cst.FunctionDef | cst.ClassDef) and parent.name is node:
                return
        if dotted(node) is None:
            return  # e.g. `x().y`: not a plain dotted chain
        self.chains.append(node)
        self.load_names[root_name(node)] += 1


def _hot_functions(ctx: ModuleContext) -> set[str]:
    """Names of forward/generate-like functions and of the functions they call (transitively)."""
    callees: dict[str, set[str]] = {}
    for call in ctx.ix.calls:
        fn = ctx.function_of(call)
        f = call.func
        if fn is None:
            continue
        if isinstance(f, cst.Name) or (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name)
                                       and f.value.value in ("self", "cls")):
            callees.setdefault(fn.name.value, set()).add(last_name(f))
    hot = {fn.name.value for fn in ctx.ix.functions if HOT_FUNCTION_RE.match(fn.name.value)}
    todo = list(hot)
    while todo:
        for callee in callees.get(todo.pop(), ()):
            if callee not in hot:
                hot.add(callee)
                todo.append(callee)
    return hot


def find_device_fallbacks(ctx: ModuleContext) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    for ref in ctx.refs:
        if ref.qual != "torch.cuda.is_available":
            continue
        for a, child in ctx.ancestors(ref.node):
            if isinstance(a, cst.IfExp) and child is a.test:
                if _mentions_cpu(a.body) or _mentions_cpu(a.orelse):
                    out.append(a)
                break
            if isinstance(a, cst.If) and child is a.test:
                if a.orelse is not None and _mentions_cpu(a.orelse):
                    out.append(a)
                break
            if isinstance(a, cst.BaseSmallStatement | cst.BaseCompoundStatement):
                break
    return out


def _mentions_cpu(node: cst.CSTNode) -> bool:
    return any(string_value(n) == "cpu" for n in walk_nodes(node)
               if isinstance(n, cst.SimpleString | cst.FormattedString))


# ----------------------------------------------------------------------------------------------
# Text files: requirements*.txt, README pip lines, shell scripts, setup.py pins, CUDA sources
# ----------------------------------------------------------------------------------------------

PIN_RE = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([A-Za-z0-9.+!*_-]+)")
REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class RequirementLine:
    line: str  # the requirement text (comment stripped), or a quoted pin of setup.py
    lineno: int
    snippet: str
    is_req: bool  # a requirements file line (or a setup.py pin), not a `pip install` command


@dataclass(frozen=True)
class TextLine:
    line: str
    lineno: int
    snippet: str


@dataclass
class TextFile:
    """A non-Python file (or setup.py's install pins) as the text detectors see it."""

    rel: str
    name: str
    text: str
    registry: FindingMaker
    kind: str = "text"  # "text" | "setup.py" | "cuda-source" | "model-config" (config.json)

    def finding(self, hazard: str, rule: str, lineno: int, col: int, snippet: str, message: str,
                category: HazardCategory, severity: Severity) -> Finding:
        return self.registry.finding(hazard, rule, self.rel, lineno, col, snippet, message, category, severity)

    def config_object(self) -> dict[str, Any] | None:
        """A model config's JSON object; None for other files or text that is not a JSON object."""
        if self.kind != "model-config":
            return None
        try:
            config = json.loads(self.text)
        except ValueError:
            return None
        return config if isinstance(config, dict) else None

    def _is_req(self) -> bool:
        return fnmatch.fnmatch(self.name, "requirements*.txt")

    def _lines(self) -> Iterator[tuple[int, str, str]]:
        """(lineno, line, snippet); comments dropped in requirements files and shell scripts."""
        strip = self._is_req() or self.name.endswith(".sh")
        for i, raw in enumerate(self.text.splitlines(), start=1):
            yield i, raw.split("#", 1)[0] if strip else raw, raw.strip()

    def requirement_lines(self) -> Iterator[RequirementLine]:
        if self.kind == "setup.py":
            for i, raw in enumerate(self.text.splitlines(), start=1):
                for m in re.finditer(r"[\"']([^\"']*==[^\"']*)[\"']", raw):
                    yield RequirementLine(m.group(1), i, raw.strip(), True)
            return
        if self.kind != "text":
            return
        is_req = self._is_req()
        for i, line, snippet in self._lines():
            if is_req or "pip install" in line:
                yield RequirementLine(line, i, snippet, is_req)

    def env_lines(self) -> Iterator[TextLine]:
        """Lines that may set environment variables (shell scripts, `export` and `pip install` lines)."""
        if self.kind != "text":
            return
        for i, line, snippet in self._lines():
            if self.name.endswith(".sh") or "export " in line or "pip install" in line:
                yield TextLine(line, i, snippet)


def requirement_names(req: RequirementLine) -> list[tuple[str, int]]:
    """(normalised name, column) of every package a requirement line names: pins first, then the
    requirement itself (or the words after `pip install`)."""
    line = req.line
    names = [(m.group(1).lower().replace("_", "-"), m.start()) for m in PIN_RE.finditer(line)]
    if req.is_req:
        m2 = REQ_NAME_RE.match(line)
        if m2 and not line.lstrip().startswith("-"):
            names.append((m2.group(1).lower().replace("_", "-"), m2.start(1)))
    else:
        for tok in re.finditer(r"(?<=\s)([A-Za-z][A-Za-z0-9._-]*)", line.split("pip install", 1)[-1]):
            names.append((tok.group(1).lower().replace("_", "-"), line.find(tok.group(1))))
    return names
