"""H25: an attribute or a keyword that changed between releases. Remote code written for one transformers
(or torch) release calls another: ``AttributeError: 'X' object has no attribute 'Y'``, ``TypeError: f() got
an unexpected keyword argument 'z'``, a None where the code expects an object, a positional count that moved.

The fixes read the running release itself (sandbox/harness/failure_hints.py, in the failing process: the live
object's attributes, the callee's signature), never a model's name:
- the release spells the same word differently (``past_key_value`` / ``past_key_values``,
  ``attn_implementation`` / ``_attn_implementation``: equal once case, underscores and a plural ``s`` are set
  aside): the failing line takes the release's spelling (``rename-changed-api``);
- the release passes a keyword the model's own function does not take (a newer generate passes
  ``cache_position`` to an older ``forward``): the function takes and ignores it (``accept-new-keyword``), as
  the older release, which never passed it, had it;
- anything else (a None, a spelling with no close twin, a positional count) is named with what the release
  offers and left to the environment of the model's era. One hazard class, one module (docs/rules.md)."""

from __future__ import annotations

import ast
import re
from typing import Any

import libcst as cst

from agents.models import Frame, StructuredException
from agents.rules.base import BLOCKS, MEDIUM, ErrorPattern, Fix, HazardRule, Signature, at_where
from agents.rules.context import ModuleContext
from agents.rules.kit import CodemodResult, Rewriter, run_codemod

HAZARD = "H25"
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_QUALNAME = re.compile(r"^[A-Za-z_][\w.]*$")
_OBJECT_ATTR = re.compile(r"^'([\w.]+)' object has no attribute '(\w+)'")
_UNEXPECTED_KW = re.compile(r"([\w.<>]+)\(\) got an unexpected keyword argument '(\w+)'")


def same_word(a: str, b: str) -> bool:
    """The same name spelled another way: case, underscores and a trailing plural ``s`` set aside."""
    def norm(s: str) -> str:
        s = s.lower().replace("_", "")
        return s[:-1] if s.endswith("s") else s

    return a != b and norm(a) == norm(b)


def respelling(name: str, candidates: Any) -> str | None:
    """The one candidate of the running release that is ``name`` respelled, else None."""
    twins = [c for c in candidates or [] if isinstance(c, str) and _IDENT.match(c) and same_word(name, c)]
    return twins[0] if len(twins) == 1 else None


# --- detector: a forward a newer generate calls with keywords it does not take --------------------------

def generative_forwards(source: str) -> list[tuple[str, int]]:
    """("Class.forward", line) of classes that generate through transformers' own
    ``prepare_inputs_for_generation`` (GenerationMixin in their lineage in this file, no
    ``prepare_inputs_for_generation`` of their own there) and whose ``forward`` takes no ``**kwargs``: a newer
    generate passes keywords (``cache_position``, ``use_cache``, ...) that such a forward does not take."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}

    def lineage(name: str, seen: frozenset[str] = frozenset()) -> list[ast.ClassDef | str]:
        c = classes.get(name)
        if c is None or name in seen:
            return [name]
        bases = [b.attr if isinstance(b, ast.Attribute) else b.id if isinstance(b, ast.Name) else "" for b in c.bases]
        return [c, *(x for b in bases for x in lineage(b, seen | {name}))]

    out = []
    for c in classes.values():
        line = lineage(c.name)
        names = {x.name if isinstance(x, ast.ClassDef) else x for x in line}
        own = {f.name for x in line if isinstance(x, ast.ClassDef) for f in x.body if isinstance(f, ast.FunctionDef)}
        fwd = next((f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
        if "GenerationMixin" in names and "prepare_inputs_for_generation" not in own and fwd is not None \
                and fwd.args.kwarg is None:
            out.append((f"{c.name}.forward", fwd.lineno))
    return out


def _h25_changed_api(ctx: ModuleContext) -> None:
    if "GenerationMixin" not in ctx.source:
        return
    lines = dict(generative_forwards(ctx.source))
    for fn in ctx.ix.functions:
        for qual, line in lines.items():
            if fn.name.value == "forward" and ctx.pos(fn)[0] <= line <= ctx.pos(fn.body)[0]:
                ctx.add(HAZARD, "forward-without-kwargs", fn,
                        f"`{qual}` takes no **kwargs and generates through transformers' "
                        "prepare_inputs_for_generation: a newer generate passes it keywords it does not take "
                        "(cache_position, use_cache, ...); it takes and ignores them, as with the release it was "
                        "written for, which never passed them",
                        BLOCKS, MEDIUM)


# --- fixes -------------------------------------------------------------------------------------

class _Respell(Rewriter):
    def __init__(self, line: int, old: str, new: str, what: str) -> None:
        super().__init__()
        self.line, self.old, self.new, self.what = line, old, new, what

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if self.what == "attribute" and original.attr.value == self.old and self.line_of(original) == self.line:
            self.note(original, f".{self.old} -> .{self.new} (the running release's spelling)")
            return updated.with_changes(attr=cst.Name(self.new))
        return updated

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        if self.what == "keyword" and original.keyword is not None and original.keyword.value == self.old \
                and self.line_of(original) == self.line:
            self.note(original, f"keyword {self.old}= -> {self.new}= (the running release's spelling)")
            return updated.with_changes(keyword=cst.Name(self.new))
        return updated


def rename_changed_api(source: str, *, line: int, old: str, new: str, what: str, **_: Any) -> CodemodResult:
    """At ``line``, the attribute (``what="attribute"``) or keyword (``"keyword"``) ``old`` becomes ``new``."""
    if not (_IDENT.match(old) and _IDENT.match(new) and what in ("attribute", "keyword") and same_word(old, new)):
        return CodemodResult(source, False)
    return run_codemod(source, lambda _m: _Respell(int(line), old, new, what))


class _AcceptKeyword(Rewriter):
    def __init__(self, qualname: str, keyword: str) -> None:
        super().__init__()
        self.path = qualname.split(".")
        self.keyword = keyword
        self.stack: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.stack.append(node.name.value)
        return True

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.stack.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.stack.append(node.name.value)
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        here = list(self.stack)
        self.stack.pop()
        if here[-len(self.path):] != self.path or original.params.star_kwarg is not None:
            return updated
        taken = {p.name.value for p in (*original.params.params, *original.params.kwonly_params,
                                        *original.params.posonly_params)}
        name = "kwargs" if "kwargs" not in taken else "_npuport_kwargs"
        said = (f"the running release passes `{self.keyword}=`" if _IDENT.match(self.keyword) else
                "a newer generate passes keywords (cache_position, use_cache, ...)")
        self.note(original, f"`{'.'.join(self.path)}` takes **{name}: {said}, which this function does not use (the "
                            "release it was written for never passed them)")
        return updated.with_changes(params=updated.params.with_changes(star_kwarg=cst.Param(cst.Name(name))))


def accept_new_keyword(source: str, *, function: str | None = None, keyword: str | None = None,
                       **_: Any) -> CodemodResult:
    """The model's function ``function`` (``Class.method`` or ``name``) takes keywords it does not use. Without
    parameters (the static plan): every forward ``generative_forwards`` names."""
    if function is None:
        result = CodemodResult(source, False)
        for qual, _line in generative_forwards(source):
            step = run_codemod(result.source, lambda _m, q=qual: _AcceptKeyword(q, "*"))
            if step.changed:
                result = CodemodResult(step.source, True, result.edits + step.edits, result.spans + step.spans)
        return result
    if not (_QUALNAME.match(function) and _IDENT.match(keyword or "")):
        return CodemodResult(source, False)
    return run_codemod(source, lambda _m: _AcceptKeyword(function, str(keyword)))


# --- the run-time errors it explains -------------------------------------------------------------

def _in_model(exc: StructuredException) -> bool:
    return bool(exc.frames) and exc.frames[-1].in_model


def _attribute(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    m = _OBJECT_ATTR.search(exc.message) if exc.type == "AttributeError" else None
    if m is None:
        return None
    cls, attr = m.group(1), m.group(2)
    hints = exc.hints or {}
    key = f"changed-api:{cls}.{attr}@{where}"
    summary = f"`{cls}` has no attribute `{attr}` {at_where(where)}"
    if cls == "NoneType":
        return Signature("changed-api", key, f"a None where the code reads `.{attr}` {at_where(where)}", frame,
                         {"no_fix": "the running release passes None where the code expects an object (a value the "
                                    "release it was written for set, e.g. a cache at the first step); the "
                                    "environment of the model's era decides, not a patch"})
    new = respelling(attr, hints.get("candidates")) if hints.get("attribute") == attr else None
    if new and frame is not None and _in_model(exc):
        return Signature("changed-api", key, f"{summary}; this release spells it `{new}`", frame,
                         {"params": {"line": frame.line, "old": attr, "new": new, "what": "attribute"},
                          "fix": "rename-changed-api"})
    close = ", ".join(f"`{c}`" for c in hints.get("candidates") or [] if isinstance(c, str) and _IDENT.match(c))
    return Signature("changed-api", key, summary, frame,
                     {"no_fix": f"this release's `{cls}` has no respelling of `{attr}`"
                                + (f" (its closest names: {close}, not the same word)" if close else "")
                                + "; the environment of the model's era decides"})


def _keyword(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    m = _UNEXPECTED_KW.search(exc.message) if exc.type == "TypeError" else None
    if m is None:
        return None
    callee, keyword = m.group(1), m.group(2)
    hints = exc.hints or {}
    key = f"changed-api:{callee}({keyword}=)@{where}"
    summary = f"`{callee}()` takes no keyword `{keyword}` ({at_where(where)})"
    caller_in_model = _in_model(exc)
    callee_file = str(hints.get("callee_file") or "")
    if not caller_in_model and callee_file and _QUALNAME.match(callee) and hints.get("keyword") == keyword:
        # the release calls the model's function with a keyword it added later
        return Signature("changed-api", key, f"{summary}: the running release passes `{keyword}=` to the model's "
                                             f"own `{callee}`", frame,
                         {"params": {"function": callee, "keyword": keyword}, "fix": "accept-new-keyword",
                          "file": callee_file, "line": hints.get("callee_line")})
    new = respelling(keyword, hints.get("candidates") or hints.get("parameters")) \
        if hints.get("keyword") == keyword else None
    if new and frame is not None and caller_in_model:
        return Signature("changed-api", key, f"{summary}; this release spells it `{new}`", frame,
                         {"params": {"line": frame.line, "old": keyword, "new": new, "what": "keyword"},
                          "fix": "rename-changed-api"})
    params = ", ".join(str(p) for p in (hints.get("parameters") or [])[:12])
    return Signature("changed-api", key, summary, frame,
                     {"no_fix": f"this release's `{callee}` has no respelling of `{keyword}`"
                                + (f" (it takes: {params})" if params else "")
                                + "; the environment of the model's era decides"})


_OTHER_TYPE = re.compile(r"takes \d+ positional arguments? but \d+ (?:was|were) given|"
                         r"'NoneType' object is not (?:subscriptable|iterable|callable)|unsupported operand type|"
                         r"got multiple values for argument|object is not (?:subscriptable|iterable|callable)")


def _other(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    """Any other AttributeError or TypeError in the model's code: the class named, no respelling to make."""
    if exc.type not in ("AttributeError", "TypeError") or (frame is None and not _OTHER_TYPE.search(exc.message)):
        return None
    first = exc.message.strip().splitlines()[0][:160] if exc.message.strip() else exc.type
    return Signature("changed-api", f"changed-api:{exc.type}@{where}", f"{exc.type} {at_where(where)}: {first}", frame,
                     {"no_fix": "a call or value the running release shapes differently from the one the code was "
                                "written for, with no respelling to make; the environment of the model's era decides"})


def _fix_named(kind: str) -> Any:
    return lambda sig: sig.details.get("fix") == kind


RULE = HazardRule(
    hazard=HAZARD,
    title="attributes and keywords that changed between releases",
    detect=_h25_changed_api,
    fixes=(Fix("rename-changed-api", rename_changed_api, "use the running release's spelling of an attribute or "
               "keyword"),
           Fix("accept-new-keyword", accept_new_keyword, "let the model's function take a keyword a newer release "
               "passes and it does not use", frozenset({"forward-without-kwargs"}), order=60)),
    explains=(
        ErrorPattern("changed-api", _attribute, "attributes that changed between releases", fix="rename-changed-api",
                     fix_if=_fix_named("rename-changed-api"), params=lambda sig: dict(sig.details["params"]), order=30),
        ErrorPattern("changed-api", _keyword, "keywords that changed between releases", fix="accept-new-keyword",
                     needs_frame=False, fix_if=lambda sig: "fix" in sig.details,
                     params=lambda sig: dict(sig.details["params"]), order=31),
        ErrorPattern("changed-api", _other, "calls and values that changed between releases", needs_frame=False,
                     order=90),
    ),
    kb_topic=f"recipe:{HAZARD}",
    left_as_written="the running release offers no respelling; the environment of the model's era decides",
    fixtures=("tests/test_debugger_classes.py",),
)
