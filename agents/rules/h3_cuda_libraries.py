"""H3: CUDA-only libraries and kernels (flash-attn, xformers, Triton, CUDA extensions; the one list is
sandbox/cuda_redirect/cuda_only.py).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import libcst as cst

from agents.models import Finding, Frame, StructuredException
from agents.rules import h3_optional_modules
from agents.rules.base import (
    BLOCKS,
    HIGH,
    LOW,
    MEDIUM,
    SLOWS,
    ErrorPattern,
    Fix,
    HazardRule,
    Signature,
)
from agents.rules.context import ModuleContext, TextFile, requirement_names
from agents.rules.cst_helpers import (
    dotted,
    import_module_names,
    match_prefix,
    root_name,
)
from agents.rules.kit import (
    CodemodResult,
    Rewriter,
    dotted_name,
    run_codemod,
)
from sandbox.cuda_redirect.cuda_only import BY_MODULE, CUDA_ONLY_DISTS, CUDA_ONLY_ROOTS

CUDA_EXTENSION_BUILD = {"torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
                        "torch.utils.cpp_extension.CUDAExtension", "torch.utils.cpp_extension.BuildExtension"}
TRITON_DECORATORS = {"triton.jit", "triton.autotune", "triton.heuristics"}


# --- detector ----------------------------------------------------------------------------------

@dataclass
class _CudaImport:
    node: cst.Import | cst.ImportFrom
    module: str
    key: str
    names: list[str]


def _cuda_imports(ctx: ModuleContext) -> list[_CudaImport]:
    out = []
    for imp in ctx.ix.imports:
        for mod, names in import_module_names(imp):
            key = match_prefix(mod, BY_MODULE)
            if key is not None:
                out.append(_CudaImport(imp, mod, key, names))
                break  # one finding per import statement
    return out


_IMPORT_ERRORS = re.compile(r"ImportError|ModuleNotFoundError|Exception")


def _raises(handler: cst.ExceptHandler | cst.ExceptStarHandler) -> bool:
    """Whether an except handler raises (again, or its own error): the import it catches is demanded."""
    found: list[cst.Raise] = []

    class _Find(cst.CSTVisitor):
        def visit_Raise(self, node: cst.Raise) -> None:
            found.append(node)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    handler.body.visit(_Find())
    return bool(found)


def _catches_import_error(handler: cst.ExceptHandler | cst.ExceptStarHandler) -> bool:
    return handler.type is None or bool(_IMPORT_ERRORS.search(cst.Module(body=[]).code_for_node(handler.type)))


def _import_demanded(ctx: ModuleContext, node: cst.CSTNode) -> bool:
    """The import sits in a try whose ``except ImportError`` handler raises (``raise ImportError("install
    flash-rwkv")``): the module refuses to import without the package, the try guards nothing."""
    for a, child in ctx.ancestors(node):
        if isinstance(a, cst.Try | cst.TryStar) and child is a.body:
            handlers = [h for h in a.handlers if _catches_import_error(h)]
            return bool(handlers) and all(_raises(h) for h in handlers)
    return False


def _import_guard(ctx: ModuleContext, node: cst.CSTNode) -> str | None:
    """'try/except ImportError' or 'if <availability check>' when the import is guarded (a handler that
    raises again guards nothing: _import_demanded)."""
    for a, child in ctx.ancestors(node):
        if isinstance(a, cst.Try | cst.TryStar) and child is a.body:
            for h in a.handlers:
                if _catches_import_error(h) and not _raises(h):
                    return "try/except ImportError"
        if isinstance(a, cst.If) and child is not a.test:
            test = ctx.code(a.test)
            if re.search(r"is_\w+_available|find_spec|HAS_\w+|_AVAILABLE\b", test):
                return f"if {test.strip()}"
    return None


def _h3_cuda_libraries(ctx: ModuleContext) -> None:
    imports = _cuda_imports(ctx)
    bound: set[str] = set()
    for ci in imports:
        lib = BY_MODULE[ci.key]
        what, todo = lib.what, lib.instead
        bound.update(n for n in ci.names if n)
        used = any(ctx.ix.load_names.get(n, 0) > 0 for n in ci.names if n)
        guard = _import_guard(ctx, ci.node)
        if guard is None and _import_demanded(ctx, ci.node):
            ctx.add("H3", "cuda-only-import-demanded", ci.node,
                    f"`{ci.module}` ({what}) is imported inside try, but its except ImportError raises again: the "
                    f"module refuses to import where the package cannot be installed (Ascend); the handler must "
                    f"fall back instead, so the model's own path runs ({todo})", BLOCKS, HIGH, fixable=lib.guarded)
        elif guard is not None:
            ctx.add("H3", "cuda-only-import-guarded", ci.node,
                    f"`{ci.module}` ({what}) is imported behind {guard}: it loads nothing on Ascend; check the "
                    f"fallback it takes is efficient ({todo})", SLOWS, LOW)
        elif not used:
            ctx.add("H3", "unused-cuda-only-import", ci.node,
                    f"`{ci.module}` ({what}) is imported but never used: the import alone fails on Ascend where "
                    "the package cannot be installed; remove it", BLOCKS, HIGH, fixable=lib.guarded)
        else:
            ctx.add("H3", "cuda-only-import", ci.node,
                    f"`{ci.module}` ({what}) is imported and used: it cannot be installed on Ascend; guard the "
                    f"import and give its call sites a fallback ({todo})", BLOCKS, HIGH, fixable=lib.guarded)
            unused = [n for n in ci.names if n and not ctx.ix.load_names.get(n, 0)]
            if unused:
                ctx.add("H3", "unused-cuda-only-import", ci.node,
                        f"{', '.join(unused)} from `{ci.module}` never used: drop "
                        f"{'it' if len(unused) == 1 else 'them'} from the import", BLOCKS, HIGH, fixable=lib.guarded)
    _h3_optional_paths(ctx, bound)
    for fn in ctx.ix.functions:
        for d in fn.decorators:
            target = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
            if ctx.qual(target) in TRITON_DECORATORS:
                ctx.add("H3", "triton-kernel", d,
                        f"`{fn.name.value}` is a Triton kernel: it is compiled for CUDA GPUs; rewrite it with torch "
                        "ops or a torch_npu fused op (triton-ascend is a separate port)", BLOCKS, HIGH)
                break
    for ref in ctx.refs:
        if ref.qual in CUDA_EXTENSION_BUILD:
            ctx.add("H3", "cuda-extension-build", ref.node,
                    f"`{ref.qual.rsplit('.', 1)[-1]}` builds a custom C++/CUDA extension: it needs nvcc and a "
                    "GPU; its kernels need a torch or Ascend C replacement", BLOCKS, HIGH)


def _h3_optional_paths(ctx: ModuleContext, bound: set[str]) -> None:
    """`if cfg.use_flash_attn: flash_attn_func(...)`: the CUDA call sits behind a flag."""
    if not bound:
        return
    for call in ctx.ix.calls:
        if root_name(call.func) not in bound:
            continue
        for a, child in ctx.ancestors(call):
            if isinstance(a, cst.FunctionDef | cst.ClassDef | cst.Module):
                break
            if isinstance(a, cst.If | cst.IfExp) and child is not a.test:
                ctx.add("H3", "optional-fused-path", a,
                        f"optional fused path: `{ctx.code(a.test).strip()}` selects a CUDA-only call "
                        f"(`{dotted(call.func)}`); on Ascend the flag must be off, or the branch must call an "
                        "NPU fused op instead", BLOCKS, MEDIUM)
                break


# --- fix ---------------------------------------------------------------------------------------

def _module_root(node: cst.Import | cst.ImportFrom) -> list[str]:
    if isinstance(node, cst.Import):
        return [dotted_name(a.name).split(".")[0] for a in node.names]
    if node.module is None or node.relative:
        return []
    return [dotted_name(node.module).split(".")[0]]


def _bound_names(node: cst.Import | cst.ImportFrom) -> list[str]:
    names: list[str] = []
    if isinstance(node.names, cst.ImportStar):
        return names
    for alias in node.names:
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            names.append(alias.asname.name.value)
        else:
            names.append(dotted_name(alias.name).split(".")[0])
    return names


class _NameUses(cst.CSTVisitor):
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._in_import = 0

    def visit_Import(self, node: cst.Import) -> None:
        self._in_import += 1

    def leave_Import(self, node: cst.Import) -> None:
        self._in_import -= 1

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._in_import += 1

    def leave_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._in_import -= 1

    def visit_Name(self, node: cst.Name) -> None:
        if not self._in_import:
            self.counts[node.value] = self.counts.get(node.value, 0) + 1


MISSING_MARKER = "class _NpuportMissing:"
MISSING_HELPER = f'''
# --- npuport: stand-in for CUDA-only libraries that are not installed (hazard H3); generated by npuport ---
{MISSING_MARKER}
    """A CUDA-only library that is not installed: the module still imports (decorators hand the function
    back, attributes and base classes are inert), and calling it on tensors names the library."""

    def __init__(self, name):
        self._npuport_name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _NpuportMissing(self._npuport_name + "." + attr)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # @lib.jit / @lib.autotune(...)(fn): the function stays as written
        if any(hasattr(a, "dtype") and hasattr(a, "shape") for a in (*args, *kwargs.values())):
            raise RuntimeError(self._npuport_name + " belongs to a CUDA-only library that is not installed; "
                               "the model must take its torch path here")
        return self  # a decorator factory or a config object: inert

    def __getitem__(self, item):
        return self  # kernel[grid]

    def __mro_entries__(self, bases):
        return (object,)  # class Layer(lib.Base): an empty base

    def __bool__(self):
        return False

    def __repr__(self):
        return "<npuport: " + self._npuport_name + " is not installed>"
'''

# A module-level flag that says the library loaded (`HAS_TRITON = True`, `XFORMERS_AVAILABLE = True`,
# `triton_enabled = True`): the model's own switch to its fallback path.
_FLAG_NAME = re.compile(r"^_?(HAS_\w+|USE_\w+|\w+_AVAILABLE|\w+_ENABLED|\w+_OK)$", re.I)
_GUARD_COMMENT = "# npuport (H3): CUDA-only library; the torch path runs without it"


def _flag_after(stmt: cst.BaseStatement) -> str | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        a = stmt.body[0]
        if (isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name)
                and isinstance(a.value, cst.Name) and a.value.value == "True"
                and _FLAG_NAME.match(a.targets[0].target.value)):
            return a.targets[0].target.value
    return None


class GuardCudaOnlyImports(Rewriter):
    """H3: drop unused imports of CUDA-only libraries; guard used ones so the module still imports.

    A guarded name that the module tests against None (`if triton is None:`) falls back to None, the
    fallback the model already has; any other name gets an inert stand-in, so `@triton.jit`, `tl.constexpr`
    and `class X(lib.Base)` keep working at import time. A `HAS_X = True` flag right after the import
    moves into the guard and is False when the library is missing."""

    def __init__(self, uses: dict[str, int], modules: frozenset[str] = CUDA_ONLY_ROOTS,
                 none_checked: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.uses = uses
        self.none_checked = none_checked
        self.modules = modules
        self.stand_in = False

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.Import | cst.ImportFrom):
            return updated
        imp = updated.body[0]
        roots = _module_root(imp)
        if not roots or not any(r in self.modules for r in roots):
            return updated
        names = _bound_names(imp)
        if names and all(self.uses.get(n, 0) == 0 for n in names):
            self.note(original, f"removed unused import of CUDA-only {', '.join(sorted(set(roots)))}")
            return cst.RemoveFromParent()
        lines = []
        for n in names:
            if n in self.none_checked:
                lines.append(f"    {n} = None")
            else:
                lines.append(f"    {n} = _NpuportMissing({self._qualname(imp, n)!r})")
                self.stand_in = True
        fallback = "\n".join(lines) or "    pass"
        code = (
            "try:\n"
            f"    {cst.Module(body=[updated]).code.strip()}\n"
            f"except ImportError:  {_GUARD_COMMENT}\n"
            f"{fallback}\n"
        )
        self.note(original, f"guarded import of CUDA-only {', '.join(sorted(set(roots)))}")
        return cst.parse_module(code).body[0]

    @staticmethod
    def _qualname(imp: cst.Import | cst.ImportFrom, bound: str) -> str:
        if isinstance(imp, cst.ImportFrom) and imp.module is not None and not isinstance(imp.names, cst.ImportStar):
            for alias in imp.names:
                asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
                if bound in (asname, dotted_name(alias.name)):
                    return f"{dotted_name(imp.module)}.{dotted_name(alias.name)}"
        if isinstance(imp, cst.Import):
            for alias in imp.names:
                asname = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else None
                if asname == bound:
                    return dotted_name(alias.name)
        return bound

    def visit_Try(self, node: cst.Try) -> bool:
        return False  # already guarded: leave as written (leave_Try: unless its handler raises again)

    def leave_Try(self, original: cst.Try, updated: cst.Try) -> cst.BaseStatement:
        """A CUDA-only import inside try whose ``except ImportError`` raises again: that handler binds the
        imported names to the fallback instead (None where the module tests them against None, else the
        inert stand-in); the try's other handlers and its body stay as written."""
        imports = [s.body[0] for s in updated.body.body if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                   and isinstance(s.body[0], cst.Import | cst.ImportFrom)
                   and any(r in self.modules for r in _module_root(s.body[0]))]
        demanding = [h for h in updated.handlers if _catches_import_error(h) and _raises(h)]
        if not imports or not demanding:
            return updated
        lines = []
        for imp in imports:
            for n in _bound_names(imp):
                if n in self.none_checked:
                    lines.append(f"{n} = None")
                else:
                    lines.append(f"{n} = _NpuportMissing({self._qualname(imp, n)!r})")
                    self.stand_in = True
        body = cst.parse_module("\n".join(lines or ["pass"]) + "\n").body
        handlers = [h.with_changes(body=h.body.with_changes(body=body,
                                                            header=cst.TrailingWhitespace(
                                                                whitespace=cst.SimpleWhitespace("  "),
                                                                comment=cst.Comment(_GUARD_COMMENT))))
                    if h in demanding else h for h in updated.handlers]
        roots = sorted({r for imp in imports for r in _module_root(imp) if r in self.modules})
        self.note(original, f"the except ImportError of CUDA-only {', '.join(roots)} falls back instead of raising")
        return updated.with_changes(handlers=handlers)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        body = list(updated.body)
        out: list[cst.BaseStatement] = []
        i = 0
        while i < len(body):
            stmt = body[i]
            flag = _flag_after(body[i + 1]) if i + 1 < len(body) else None
            if isinstance(stmt, cst.Try) and _GUARD_COMMENT in updated.code_for_node(stmt) and flag:
                code = updated.code_for_node(stmt).rstrip("\n").split("\n")
                cut = next(k for k, ln in enumerate(code) if ln.startswith("except ImportError"))
                code = [*code[:cut], f"    {flag} = True", *code[cut:], f"    {flag} = False"]
                out.append(cst.parse_module("\n".join(code) + "\n").body[0])
                self.edits.append(f"{flag} is False when the CUDA-only library is missing (the model's fallback)")
                i += 2
                continue
            out.append(stmt)
            i += 1
        module = updated.with_changes(body=out)
        if self.stand_in and MISSING_MARKER not in module.code:
            module = _insert_at_top(module, MISSING_HELPER)
        return module


def _insert_at_top(module: cst.Module, code: str) -> cst.Module:
    """After the docstring and `from __future__` imports: the guards that use it come right after."""
    body = list(module.body)
    idx = 0
    for i, stmt in enumerate(body):
        is_doc = i == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) \
            and isinstance(stmt.body[0].value, cst.SimpleString | cst.ConcatenatedString)
        is_future = isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.ImportFrom) \
            and stmt.body[0].module is not None and dotted_name(stmt.body[0].module) == "__future__"
        if is_doc or is_future:
            idx = i + 1
        else:
            break
    parsed = cst.parse_module(code)
    helpers = list(parsed.body)
    if parsed.header:
        helpers[0] = helpers[0].with_changes(leading_lines=[*parsed.header, *helpers[0].leading_lines])
    return module.with_changes(body=[*body[:idx], *helpers, *body[idx:]])


class _NoneChecks(cst.CSTVisitor):
    """Names the module compares with None (`x is None`, `x is not None`, `x == None`)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Comparison(self, node: cst.Comparison) -> None:
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        if any(isinstance(o, cst.Name) and o.value == "None" for o in operands):
            self.names |= {o.value for o in operands if isinstance(o, cst.Name) and o.value != "None"}


def guard_cuda_only_imports(source: str, **_: Any) -> CodemodResult:
    def make(module: cst.Module) -> Rewriter:
        uses = _NameUses()
        module.visit(uses)
        checks = _NoneChecks()
        module.visit(checks)
        return GuardCudaOnlyImports(uses.counts, none_checked=frozenset(checks.names))

    return run_codemod(source, make)


def _h3_text(tf: TextFile) -> list[Finding]:
    if tf.kind == "cuda-source":
        return [tf.finding("H3", "cuda-source-file", 1, 0, "",
                           "CUDA C++ source: it compiles only with nvcc for NVIDIA GPUs; its kernels need a torch or "
                           "Ascend C replacement", BLOCKS, HIGH)]
    out: list[Finding] = []
    for req in tf.requirement_lines():
        for norm, col in requirement_names(req):
            if norm in CUDA_ONLY_DISTS:
                out.append(tf.finding("H3", "cuda-only-requirement", req.lineno, col, req.snippet,
                                      f"requires `{norm}`, a CUDA-only package: it does not install or import on "
                                      "Ascend; drop it and port its call sites", BLOCKS, HIGH))
                break
    return out


_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")


def _missing_cuda_module(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    if exc.type in ("ModuleNotFoundError", "ImportError") and (mm := _MISSING_MODULE.search(exc.message)):
        root = mm.group(1).split(".")[0]
        if root in CUDA_ONLY_ROOTS:
            return Signature("missing-cuda-module", f"missing-cuda-module:{root}@{where}",
                             f"the model imports {mm.group(1)}, which is not installed here (a CUDA-only library)",
                             frame)
    return None


RULE = HazardRule(
    hazard="H3",
    title="CUDA-only libraries and kernels",
    detect=_h3_cuda_libraries,
    detect_text=_h3_text,
    fixes=(Fix("guard-cuda-only-imports", guard_cuda_only_imports, "remove or guard imports of CUDA-only libraries",
               frozenset({"cuda-only-import", "unused-cuda-only-import", "cuda-only-import-demanded"}), order=10),),
    manual={
        "cuda-only-import-guarded": "already guarded; whether its fallback is efficient needs a person's look",
        "optional-fused-path": "the flag that selects the CUDA-only call is the model's configuration",
        "triton-kernel": "a Triton kernel needs a rewrite with torch ops or a torch_npu fused op",
        "cuda-extension-build": "a custom CUDA extension needs a torch or Ascend C replacement",
        "cuda-source-file": "CUDA C++ needs a torch or Ascend C replacement",
        "cuda-only-requirement": "requirements are resolved by the environment step, which drops CUDA-only packages",
    },
    explains=(ErrorPattern("missing-cuda-module", _missing_cuda_module, "CUDA-only libraries",
                           fix="guard-cuda-only-imports", order=10),),
    kb_topic="recipe:H3",
    left_as_written="the CUDA-only path stays off (its import is guarded or gone); the torch path runs",
    fixtures=("tests/test_scanner.py", "tests/test_codemods.py", "examples/tiny_llm",
              "tests/test_zoo_model_classes.py"),
    refine=h3_optional_modules.refine,
)
