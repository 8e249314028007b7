"""H24: a name missing at run time. Old remote code uses names nothing in the file binds: ``List`` that an
older release's star import leaked (``from transformers.modeling_utils import *``), a helper that moved
between transformers releases (``from transformers.modeling_utils import find_pruneable_heads_and_indices``),
``math`` or ``F`` bound in another of the model's files. The run fails with ``NameError: name 'List' is not
defined`` or ``ImportError: cannot import name 'X' from 'M'``.

The fix is the import that provides the name (``import-missing-name``), chosen from what provides it where the
model runs (sandbox/harness/failure_hints.py, read in the failing process): the failing file's own star import
(the module still has it, only its ``__all__`` no longer exports it), how the model's other files bind it,
typing, the model's own module defining it, the installed transformers' module defining it, a standard-library
module of that name. A name that is transformers' own and that this release lacks everywhere is the
environment's question (another release may have it): the class names it and fixes nothing. The scan reports
names no statement of the file binds (no star import in the file), fixed before the first run when typing or
the standard library provides them. One hazard class, one module (see docs/rules.md)."""

from __future__ import annotations

import builtins
import re
import symtable
import sys
import typing
from typing import Any

import libcst as cst

from agents.models import Frame, StructuredException
from agents.rules.base import BLOCKS, HIGH, MEDIUM, ErrorPattern, Fix, HazardRule, Signature, at_where
from agents.rules.context import ModuleContext
from agents.rules.kit import CodemodResult, insert_after_imports

HAZARD = "H24"
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_DOTTED = re.compile(r"^\.*[A-Za-z_][\w.]*$")
_STATEMENT = re.compile(r"^(?:from (\.*[A-Za-z_][\w.]*|\.+) import [A-Za-z_]\w*(?: as [A-Za-z_]\w*)?"
                        r"|import [A-Za-z_][\w.]*(?: as [A-Za-z_]\w*)?)$")
_NAME_ERROR = re.compile(r"name '(\w+)' is not defined")
_CANNOT_IMPORT = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
_MODULE_ATTR = re.compile(r"^module '([\w.]+)' has no attribute '(\w+)'")
# Module-level names Python gives every module (symtable sees them as unbound globals).
_MODULE_DUNDERS = frozenset({"__name__", "__file__", "__doc__", "__package__", "__spec__", "__loader__",
                             "__builtins__", "__path__", "__annotations__", "__dict__", "__class__"})
# The order of faithfulness: what the old release provided, how the authors bound it elsewhere, then the rest.
PROVIDER_ORDER = ("star-import", "model-import", "typing", "model-definition", "transformers", "stdlib")


# --- the analysis the detector and the codemod share ---------------------------------------------

def free_names(source: str, path: str = "<model>") -> dict[str, int]:
    """Names read somewhere in the module that nothing in it binds (nor builtins, nor a star import: a
    module with one is left to the run), with the first line that reads each."""
    if re.search(r"^\s*from\s+\S+\s+import\s+\*", source, re.M):
        return {}
    try:
        table = symtable.symtable(source, path, "exec")
    except (SyntaxError, ValueError):
        return {}
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    free: set[str] = set()

    def visit(t: symtable.SymbolTable) -> None:
        for s in t.get_symbols():
            n = s.get_name()
            is_free_global = s.is_referenced() and (t is table and not (s.is_assigned() or s.is_imported())
                                                    or t is not table and s.is_global() and not s.is_declared_global())
            if is_free_global and n not in bound:
                free.add(n)
        for child in t.get_children():
            visit(child)

    visit(table)
    free -= set(dir(builtins)) | _MODULE_DUNDERS
    lines = source.splitlines()
    return {n: next((i + 1 for i, ln in enumerate(lines) if re.search(rf"\b{re.escape(n)}\b", ln)), 1)
            for n in sorted(free)}


def static_provider(name: str) -> str | None:
    """The import the scan can name without running anything: typing's name, a standard-library module."""
    if hasattr(typing, name) and not name.startswith("_"):
        return f"from typing import {name}"
    if name in getattr(sys, "stdlib_module_names", ()):
        return f"import {name}"
    return None


# --- detector ----------------------------------------------------------------------------------

def _h24_missing_names(ctx: ModuleContext) -> None:
    for name, line in free_names(ctx.source, ctx.path).items():
        provider = static_provider(name)
        node = _first_use(ctx, name, line)
        if node is None:
            continue
        ctx.add(HAZARD, "unbound-name", node,
                f"`{name}` is read but nothing in this file binds it (no import, def or assignment): NameError when "
                + (f"this line runs; `{provider}` provides it" if provider else
                   "this line runs, unless something injects it; the run's failing process names what provides it"),
                BLOCKS, HIGH if provider else MEDIUM, fixable=provider is not None)


def _first_use(ctx: ModuleContext, name: str, line: int) -> cst.CSTNode | None:
    for ref in ctx.refs:
        if (ref.node.value if isinstance(ref.node, cst.Name) else "") == name or \
                (isinstance(ref.node, cst.Attribute) and ctx.code(ref.node).split(".")[0] == name):
            return ref.node
    return None


# --- fix ---------------------------------------------------------------------------------------

def import_missing_name(source: str, *, statement: str | None = None, name: str | None = None,
                        from_module: str | None = None, **_: Any) -> CodemodResult:
    """Add the import that provides a missing name. Without parameters: every unbound name typing or the
    standard library provides (the static plan). With ``statement`` (a validated import) and ``name``: that
    import; with ``from_module`` too, the import of ``name`` from that module is taken out of the file's
    ``from <from_module> import ...`` first (the name moved)."""
    if statement is None:
        wanted = {n: p for n in free_names(source) if (p := static_provider(n))}
        if not wanted:
            return CodemodResult(source, False)
        return _insert(source, wanted, removed=None)
    if not (name and _IDENT.match(name) and _STATEMENT.match(statement)):
        return CodemodResult(source, False, skipped=[f"line 1-1: not an import of one name: {statement!r}"])
    if from_module is not None and not _DOTTED.match(from_module):
        return CodemodResult(source, False)
    return _insert(source, {name: statement}, removed=from_module)


def _insert(source: str, wanted: dict[str, str], removed: str | None) -> CodemodResult:
    module = cst.parse_module(source)
    edits: list[str] = []
    if removed is not None:
        (name,) = wanted
        module, line = _drop_import(module, removed, name)
        if line:
            edits.append(f"line {line}: `{name}` no longer imported from {removed} (this release does not have it "
                         "there)")
    have = module.code
    lines = [st for st in dict.fromkeys(wanted.values()) if not re.search(rf"^{re.escape(st)}$", have, re.M)]
    if not lines:
        return CodemodResult(source, False)
    block = "".join(f"{st}  # npuport: provides a name this file reads (hazard H24)\n" for st in lines)
    module = insert_after_imports(module, block, "\0never-present\0")
    code = module.code
    at = next((i + 1 for i, ln in enumerate(code.splitlines()) if ln.startswith(lines[0])), 1)
    edits += [f"line {at}: `{st}` added: {', '.join(n for n, s in wanted.items() if s == st)} was read but not "
              "bound in this release" for st in lines]
    return CodemodResult(code, code != source, edits, [(at, at)])


def _drop_import(module: cst.Module, from_module: str, name: str) -> tuple[cst.Module, int]:
    """Remove ``name`` from the module's ``from <from_module> import ...`` statements (any nesting level)."""
    found: list[int] = []

    class Drop(cst.CSTTransformer):
        def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> Any:
            mod = "." * len(updated.relative) + (cst.Module([]).code_for_node(updated.module) if updated.module else "")
            if mod != from_module or isinstance(updated.names, cst.ImportStar):
                return updated
            keep = [a for a in updated.names if not (isinstance(a.name, cst.Name) and a.name.value == name
                                                     and a.asname is None)]
            if len(keep) == len(updated.names):
                return updated
            found.append(1)
            if not keep:
                return cst.RemoveFromParent()
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(names=keep)

    new = module.visit(Drop())
    line = next((i + 1 for i, ln in enumerate(module.code.splitlines())
                 if re.search(rf"from {re.escape(from_module)} import .*\b{name}\b", ln)), 0)
    return (new, line) if found else (module, 0)


# --- the run-time errors it explains -------------------------------------------------------------

def choose_provider(hints: dict[str, Any], failing_file: str | None) -> str | None:
    """The import to add, from the failing process's providers: the most faithful kind first, each statement
    checked to be an import of one name; a definition in another model file becomes a relative import."""
    providers = [p for p in hints.get("providers") or [] if isinstance(p, dict)]
    name = hints.get("name")
    if not isinstance(name, str) or not _IDENT.match(name):
        return None
    for kind in PROVIDER_ORDER:
        for p in providers:
            if p.get("kind") != kind:
                continue
            statement = str(p.get("statement") or "")
            if kind == "model-definition":
                statement = _relative_import(str(p.get("file") or ""), failing_file, name) or ""
            if statement and _STATEMENT.match(statement) and re.search(rf"\b{name}$", statement):
                return statement
    return None


def _relative_import(defining: str, failing: str | None, name: str) -> str | None:
    """``from .<module> import name`` when the defining file sits in the failing file's folder."""
    if not defining.endswith(".py") or failing is None:
        return None
    d_parts, f_parts = defining[:-3].split("/"), failing.split("/")
    if d_parts[:-1] != f_parts[:-1] or defining == failing:
        return None
    return f"from .{d_parts[-1]} import {name}"


def _missing_name(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    hints = exc.hints or {}
    if exc.type == "NameError" and (m := _NAME_ERROR.search(exc.message)):
        name, from_module = m.group(1), None
    elif exc.type == "ImportError" and (m := _CANNOT_IMPORT.search(exc.message)):
        name, from_module = m.group(1), m.group(2)
    elif exc.type == "AttributeError" and (m := _MODULE_ATTR.search(exc.message)):
        name, from_module = m.group(2), m.group(1)
    else:
        return None
    key = f"missing-name:{name}@{where}"
    said = exc.message.strip().splitlines()[0][:200] if exc.message.strip() else f"`{name}` is missing"
    release = str(hints.get("release") or "")
    last_in_model = bool(exc.frames) and exc.frames[-1].in_model
    statement = choose_provider({**hints, "name": name}, frame.file if frame else None) \
        if hints.get("name") == name and last_in_model else None
    if frame is None or not last_in_model:
        return Signature("missing-name", key, f"{said} (raised outside the model's files)", frame,
                         {"no_fix": "the missing-name class adds imports to the model's own files; this name is "
                                    "missing in a library's"})
    # where the environment's retry of another transformers release looks (it comes first when one provides it)
    seam = {"transformers_name": {"module": from_module, "name": name, "release": release}} \
        if (from_module or "").startswith("transformers") else {}
    if statement is None:
        why = (f"transformers {release} has no `{name}` anywhere: another transformers release may provide it "
               "(the environment's choice of release, not a patch)" if (from_module or "").startswith("transformers")
               else f"nothing where the model runs provides `{name}` (not a star import of the file, not the "
                    f"model's files, not typing, not transformers {release}, not a standard-library module)")
        return Signature("missing-name", key, f"{said} {at_where(where)}", frame, {"no_fix": why, **seam})
    params: dict[str, Any] = {"statement": statement, "name": name}
    if from_module is not None and exc.type == "ImportError":
        params["from_module"] = from_module
    return Signature("missing-name", key, f"{said} {at_where(where)}; `{statement}` provides it here", frame,
                     {"params": params, **seam})


RULE = HazardRule(
    hazard=HAZARD,
    title="names missing at run time (an old star import, a helper that moved)",
    detect=_h24_missing_names,
    fixes=(Fix("import-missing-name", import_missing_name, "import a name the file reads but does not bind",
               frozenset({"unbound-name"}), order=5),),
    explains=(ErrorPattern("missing-name", _missing_name, "names missing at run time", fix="import-missing-name",
                           fix_if=lambda sig: "params" in sig.details,
                           params=lambda sig: dict(sig.details.get("params") or {}), order=20),),
    kb_topic=f"recipe:{HAZARD}",
    left_as_written="no module the scan can see provides the name; the run's failing process names one",
    fixtures=("tests/test_debugger_classes.py",),
)
