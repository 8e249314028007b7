"""The codemod kit: what every codemod shares (libcst rewriting, helper insertion, small cst tools).

A codemod is a pure function ``source text (+ params) -> CodemodResult`` (unchanged when nothing applies),
so tests can drive it on snippets; the patcher commits each applied codemod. Ported code stays
device-agnostic: it runs on an Ascend NPU where torch_npu is present and on the CPU elsewhere, through
small helpers inserted at the top of each patched module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider


@dataclass
class CodemodResult:
    source: str
    changed: bool
    edits: list[str] = field(default_factory=list)  # one line per rewrite, "line N: what"
    spans: list[tuple[int, int]] = field(default_factory=list)  # the original lines each rewrite covers
    skipped: list[str] = field(default_factory=list)  # "line N-M: why left as written" for sites it declined


def is_cuda_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))
    return False


def dotted_name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = dotted_name(node.value)
        return f"{inner}.{node.attr.value}" if inner else ""
    return ""


DEVICE_CALL = cst.parse_expression("_npuport_device()")
DEVICE_TYPE = cst.parse_expression("_npuport_device().type")


class Rewriter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.edits: list[str] = []
        self.spans: list[tuple[int, int]] = []
        self.skipped: list[str] = []

    def line_of(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def note(self, node: cst.CSTNode, what: str) -> None:
        pos = self.get_metadata(PositionProvider, node)
        self.edits.append(f"line {pos.start.line}: {what}")
        self.spans.append((pos.start.line, pos.end.line))

    def skip(self, node: cst.CSTNode, why: str) -> None:
        """A site the codemod was planned for but leaves as written, with the reason (shown in the report)."""
        pos = self.get_metadata(PositionProvider, node)
        self.skipped.append(f"line {pos.start.line}-{pos.end.line}: {why}")


def insert_after_imports(module: cst.Module, code: str, marker: str) -> cst.Module:
    if marker in module.code:
        return module
    body = list(module.body)
    idx = 0
    for i, stmt in enumerate(body):
        is_import = isinstance(stmt, cst.SimpleStatementLine) and all(
            isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body
        )
        is_docstring = i == 0 and m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())]))
        if is_import or is_docstring:
            idx = i + 1
        elif isinstance(stmt, cst.Try) and "import" in module.code_for_node(stmt).split("\n", 2)[1]:
            idx = i + 1  # keep guarded imports together
        elif isinstance(stmt, cst.ClassDef) and stmt.name.value == "_NpuportMissing":
            idx = i + 1  # the H3 stand-in the guarded imports use comes before them
        else:
            break
    parsed = cst.parse_module(code)
    helpers = list(parsed.body)
    if parsed.header:  # libcst keeps leading comments in the header: carry them along
        helpers[0] = helpers[0].with_changes(leading_lines=[*parsed.header, *helpers[0].leading_lines])
    return module.with_changes(body=[*body[:idx], *helpers, *body[idx:]])


def ensure_import_torch(module: cst.Module) -> cst.Module:
    for stmt in module.body:
        if m.matches(stmt,
                     m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"), asname=None)])])):
            return module
    return insert_after_imports(module, "import torch\n", "\nimport torch\n")


_HELPER_NAME = re.compile(r"\b_[Nn]puport\w*")


def _top_level_names(stmt: cst.BaseStatement) -> set[str]:
    """What a helper statement defines: a function, a class or an assigned module-level name."""
    if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
        return {stmt.name.value}
    a = single_assign(stmt)
    return {a[0]} if a is not None else set()


def _defined_in(module_code: str, name: str) -> bool:
    return bool(re.search(rf"^(def|class) {re.escape(name)}\b|^{re.escape(name)} = ", module_code, re.M))


def insert_used_helpers(module: cst.Module, helpers: Sequence[tuple[str, str]]) -> cst.Module:
    """Insert, from the helper blocks, only the definitions the module uses (directly or through another
    helper) and does not define yet; a block's other statements (its guarded imports) come along with
    any of its definitions. A file that calls `_npuport_device()` gets that function, not the CPU
    stand-ins for streams and graphs it never reaches."""
    blocks: list[tuple[list[cst.BaseStatement], list[tuple[str, cst.BaseStatement]], str]] = []
    defs: dict[str, cst.BaseStatement] = {}
    for code, _marker in helpers:
        parsed = cst.parse_module(code)
        glue: list[cst.BaseStatement] = []
        named: list[tuple[str, cst.BaseStatement]] = []
        for st in parsed.body:
            names = _top_level_names(st)
            if names:
                for n in names:
                    named.append((n, st))
                    defs.setdefault(n, st)
            else:
                glue.append(st)
        header = "".join(code_of(line) for line in parsed.header if line.comment is not None)
        blocks.append((glue, named, header))
    current = module.code
    need = set(_HELPER_NAME.findall(current))
    wanted: set[str] = set()
    todo = [n for n in need if n in defs]
    while todo:
        n = todo.pop()
        if n in wanted or _defined_in(current, n):
            continue
        wanted.add(n)
        todo += [r for r in _HELPER_NAME.findall(code_of(defs[n])) if r in defs and r not in wanted]
    if not wanted:
        return module
    module = ensure_import_torch(module)
    for glue, named, header in blocks:
        seen: list[cst.BaseStatement] = []
        for n, stmt in named:
            if n in wanted and not any(stmt is s for s in seen):
                seen.append(stmt)
        if not seen:
            continue
        parts = [code_of(g) for g in glue if code_of(g).strip() not in module.code]
        if header.strip() and header.strip() not in module.code:
            parts.insert(0, header)
        text = "".join([*parts, *(code_of(s) for s in seen)])
        module = insert_after_imports(module, "\n" + text, "\0never-present\0")
    return module


def run_codemod(source: str, make: Callable[[cst.Module], Rewriter],
                helpers: Sequence[tuple[str, str]] = ()) -> CodemodResult:
    module = cst.parse_module(source)
    rewriter = make(module)
    # A tree parsed here has no shared nodes, so the wrapper's defensive deep copy (a fifth of a codemod's time)
    # is skipped; the makers read values (names, lines) from ``module``, never node identities.
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(rewriter)
    if not rewriter.edits:
        return CodemodResult(source, False, skipped=rewriter.skipped)
    if helpers:
        new_module = insert_used_helpers(new_module, helpers)
    code = new_module.code  # one codegen of the whole module (it is the costly part on a large file)
    return CodemodResult(code, code != source, rewriter.edits, rewriter.spans, rewriter.skipped)


def rewrite_spans(module: cst.Module, positions: Mapping[cst.CSTNode, CodeRange],
                  rewriter: Rewriter) -> list[tuple[int, int]]:
    """The original lines a rewriter would change in an already parsed module, given that module's
    PositionProvider metadata (a detector's question: which sites does the fix cover). No re-parse, no
    second position pass, no code generated: on a large model those cost seconds."""
    rewriter.metadata = {PositionProvider: positions}  # type: ignore[dict-item]
    module.visit(rewriter)
    return rewriter.spans


# ----------------------------------------------------------------------------------------------
# Small tools of the pattern rewrites (H4, H6)
# ----------------------------------------------------------------------------------------------


EMPTY_MODULE = cst.Module(body=[])


def code_of(node: cst.CSTNode) -> str:
    return EMPTY_MODULE.code_for_node(node)


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from walk(child)


def name_uses(node: cst.CSTNode) -> list[str]:
    """Names read in node (attribute names after a dot are not names)."""
    out: list[str] = []

    def visit(n: cst.CSTNode) -> None:
        if isinstance(n, cst.Name):
            out.append(n.value)
            return
        if isinstance(n, cst.Attribute):
            visit(n.value)
            return
        if isinstance(n, cst.Arg):
            visit(n.value)  # keyword names are not reads
            return
        for c in n.children:
            visit(c)

    visit(node)
    return out


def single_assign(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """`name = value` as one simple statement -> (name, value)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        s = stmt.body[0]
        if isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name):
            return s.targets[0].target.value, s.value
    return None


def assigned_names(stmt: cst.CSTNode) -> set[str]:
    """Names a statement binds (assignment targets, for targets, with-as, imports, defs)."""
    out: set[str] = set()
    for n in walk(stmt):
        targets: list[cst.CSTNode] = []
        if isinstance(n, cst.AssignTarget | cst.AnnAssign | cst.AugAssign | cst.For):
            targets.append(n.target)
        elif isinstance(n, cst.AsName):
            targets.append(n.name)
        elif isinstance(n, cst.NamedExpr):
            targets.append(n.target)
        elif isinstance(n, cst.FunctionDef | cst.ClassDef):
            out.add(n.name.value)
        for t in targets:
            if isinstance(t, cst.Name):
                out.add(t.value)
            elif isinstance(t, cst.Tuple | cst.List):
                out |= {e.value.value for e in t.elements if isinstance(e.value, cst.Name)}
    return out


def kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def is_int(node: cst.BaseExpression | None, value: int) -> bool:
    if isinstance(node, cst.Integer):
        return int(node.value) == value
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, cst.Integer) and -int(node.expression.value) == value
    return False


def is_true(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


class Rename(cst.CSTTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def transform(self, e: cst.BaseExpression) -> cst.BaseExpression:
        out = e.visit(self)
        assert isinstance(out, cst.BaseExpression)
        return out

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        return updated.with_changes(attr=original.attr)  # attribute names are not variables

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return cst.Name(self.names[original.value]) if original.value in self.names else updated


def paren(e: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(e, cst.Name | cst.Call | cst.Attribute | cst.Subscript | cst.Integer | cst.Float):
        return e
    return e.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class PerfRewriter(Rewriter):
    """A rewriter that leaves npuport's own inserted helpers alone (they hold the original formulas)."""

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return not node.name.value.startswith("_npuport_")
