"""H13: kernel-path flags (`triton_enabled = True`, `use_flash_attn=True`) that choose a CUDA-only path.

A flag the code sets to the literal True and then branches on to build or run its kernel path, with the
torch path in the other branch (`self.use_flash_attention = True` ... `if self.use_flash_attention:
FlashAttention(...) else: Attention(...)`), is hard-wired: no config reaches it, so the port fails where the
flash module is built. That is a blocker with a fix: the flag is set False, so the model's own eager/SDPA
branch runs.

One hazard class, one module: detector, fix (the reason it is manual), its knowledge-base topic
(see docs/rules.md)."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from agents.rules.base import BLOCKS, HIGH, MEDIUM, Fix, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes
from agents.rules.kit import CodemodResult, Rewriter, run_codemod
from sandbox.cuda_redirect.cuda_only import BY_MODULE

# A flag that switches on a CUDA-only kernel path, by its name.
KERNEL_FLAG = re.compile(
    r"^_?(use_|enable_|has_)?(triton|flash_?attn\w*|flash_attention\w*|xformers|apex|fused_\w+|cuda_kernels?|"
    r"cutlass|bnb|bitsandbytes|liger)(_enabled|_available|_kernels?)?$", re.I)


def _is_true(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _flag_name(node: cst.BaseExpression) -> str | None:
    """NAME for `NAME` or `self.NAME` (a flag read or assigned)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None


def _branch_names(module: cst.Module) -> set[str]:
    """Kernel flags some `if FLAG: ... else: ...` (statement or expression) branches on directly, so a
    False flag takes the other branch (the model's torch path)."""
    out: set[str] = set()
    for node in walk_nodes(module):
        if isinstance(node, cst.If) and node.orelse is not None or isinstance(node, cst.IfExp):
            name = _flag_name(node.test)
            if name and KERNEL_FLAG.match(name):
                out.add(name)
    return out


def hard_wired(module: cst.Module) -> set[str]:
    """Kernel flags the file sets to the literal True (never from a config or argument) and branches on."""
    assigned: dict[str, list[bool]] = {}
    for node in walk_nodes(module):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            name = _flag_name(node.targets[0].target)
            if name:
                assigned.setdefault(name, []).append(_is_true(node.value))
    return {n for n in _branch_names(module) if assigned.get(n) and all(assigned[n])}


class _FlagsOff(Rewriter):
    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        name = _flag_name(original.targets[0].target) if len(original.targets) == 1 else None
        if name in self.names and _is_true(original.value):
            self.note(original, f"{name} = True -> False: the model's own torch (eager/SDPA) branch runs, the "
                                "CUDA-only kernel path is never built")
            return updated.with_changes(value=cst.Name("False"))
        return updated


def _guarded_kernel_names(module: cst.Module) -> set[str]:
    """Names a try/except binds from a CUDA-only library (``from flash_attn... import f`` / ``f = None``)."""
    names: set[str] = set()
    for node in walk_nodes(module):
        if not isinstance(node, cst.Try):
            continue
        for stmt in node.body.body:
            for sub in walk_nodes(stmt):
                if isinstance(sub, cst.ImportFrom) and sub.module is not None and not sub.relative \
                        and _cuda_only(_dotted_code(sub.module)) and not isinstance(sub.names, cst.ImportStar):
                    names |= {(a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else
                               _dotted_code(a.name).split(".")[-1]) for a in sub.names}
    return names


def _dotted_code(node: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(node).strip()


def kernel_asserts(module: cst.Module) -> list[cst.Assert]:
    """``assert <kernel> is not None`` in an ``__init__``: a module that cannot even be built without a
    CUDA-only kernel, although its forward takes that kernel only on the path a flag selects."""
    kernels = _guarded_kernel_names(module)
    out: list[cst.Assert] = []
    for fn in walk_nodes(module):
        if isinstance(fn, cst.FunctionDef) and fn.name.value == "__init__":
            out += [a for a in walk_nodes(fn) if isinstance(a, cst.Assert)
                    and any(isinstance(n, cst.Name) and n.value in kernels for n in walk_nodes(a.test))]
    return out


class _DeferKernelAsserts(Rewriter):
    """Drops the asserts kernel_asserts() finds (matched by their test's code: the wrapper visits a copy)."""

    def __init__(self, tests: set[str]) -> None:
        super().__init__()
        self.tests = tests
        self._in_init = 0

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._in_init += node.name.value == "__init__"

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        self._in_init -= original.name.value == "__init__"
        return updated

    def leave_Assert(self, original: cst.Assert, updated: cst.Assert) -> cst.BaseSmallStatement:
        if not self._in_init or _dotted_code(original.test) not in self.tests:
            return updated
        self.note(original, "construction no longer requires the CUDA-only kernel: only its forward path uses it, "
                            "and the kernel-path flag (off on Ascend) selects the model's torch path")
        return cst.Pass()


def defer_kernel_asserts(source: str, **_: Any) -> CodemodResult:
    tests = {_dotted_code(a.test) for a in kernel_asserts(cst.parse_module(source))}
    return run_codemod(source, lambda _m: _DeferKernelAsserts(tests))


def kernel_path_off(source: str, **_: Any) -> CodemodResult:
    module = cst.parse_module(source)
    return run_codemod(source, lambda _m: _FlagsOff(hard_wired(module)))


def _h13_flags(ctx: ModuleContext) -> None:
    for a in kernel_asserts(ctx.module):
        ctx.add("H13", "kernel-assert-at-build", a,
                f"`{ctx.code(a).strip()[:80]}` in a constructor: the module cannot be built without the CUDA-only "
                "kernel, so the model fails at construction on Ascend even where a flag would take the torch "
                "path; the check belongs where the kernel is called", BLOCKS, HIGH)
    wired = hard_wired(ctx.module)
    for node in walk_nodes(ctx.module):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and (flag := _flag_name(node.targets[0].target)) \
                and flag in wired and _is_true(node.value):
            ctx.add("H13", "hard-wired-kernel-path", node,
                    f"`{flag}` is set to True in the code and branches to a CUDA-only kernel path (no config "
                    "switches it): on Ascend that path fails where it is built or run; set False, the model's own "
                    "torch (eager/SDPA) branch runs", BLOCKS, HIGH)
            continue
        name: str | None = None
        value: cst.BaseExpression | None = None
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            t = node.targets[0].target
            name = t.value if isinstance(t, cst.Name) else t.attr.value if isinstance(t, cst.Attribute) else None
            value = node.value
        elif isinstance(node, cst.Param) and node.default is not None:
            name, value = node.name.value, node.default
        elif isinstance(node, cst.Arg) and node.keyword is not None:
            name, value = node.keyword.value, node.value
        if name and _is_true(value) and KERNEL_FLAG.match(name):
            ctx.add("H13", "kernel-path-flag", node,
                    f"`{name}` = True selects a CUDA-only kernel path: on Ascend the flag must be off (the torch "
                    "path) or choose an NPU fused op", BLOCKS, MEDIUM)
        if isinstance(node, cst.Try):
            _availability_flags(ctx, node)


def _cuda_only(module: str) -> str | None:
    parts = module.split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in BY_MODULE), None)


def _availability_flags(ctx: ModuleContext, node: cst.Try) -> None:
    """``try: import <CUDA-only library>; FLAG = True except ImportError: FLAG = False``: whatever the flag
    is called, it is the switch between the library's kernel path and the fallback."""
    libs: list[str] = []
    for stmt in node.body.body:
        for sub in walk_nodes(stmt):
            if isinstance(sub, cst.Import):
                libs += [lib for a in sub.names if (lib := _cuda_only(ctx.code(a.name).strip()))]
            elif isinstance(sub, cst.ImportFrom) and sub.module is not None and not sub.relative:
                lib = _cuda_only(ctx.code(sub.module).strip())
                libs += [lib] if lib else []
    if not libs:
        return
    for stmt in node.body.body:
        for sub in walk_nodes(stmt):
            if isinstance(sub, cst.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0].target, cst.Name) \
                    and _is_true(sub.value) and not KERNEL_FLAG.match(sub.targets[0].target.value):
                ctx.add("H13", "kernel-path-flag", sub,
                        f"`{sub.targets[0].target.value}` = True records that {libs[0]} imported: it switches "
                        "between that CUDA-only library's kernel path and the model's fallback", BLOCKS, MEDIUM)


RULE = HazardRule(
    hazard="H13",
    title="Kernel-path flags",
    detect=_h13_flags,
    fixes=(Fix("kernel-path-off", kernel_path_off, "a hard-wired kernel-path flag set False (the torch branch runs)",
               frozenset({"hard-wired-kernel-path"}), order=45),
           Fix("defer-kernel-assert", defer_kernel_asserts, "a constructor's assert that a CUDA-only kernel "
               "imported is dropped (the forward path that calls it is the flag's)",
               frozenset({"kernel-assert-at-build"}), order=46),),
    manual={"kernel-path-flag": "the flag is the model's configuration; the import guard (H3) sets HAS_* flags "
                                "False where the library is missing, other flags are the user's choice"},
    kb_topic="recipe:H13",
    left_as_written="the flag stays as configured; where the library is missing the torch path runs",
    fixtures=("tests/test_new_hazards.py", "tests/test_zoo_model_classes.py"),
)
