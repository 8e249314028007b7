"""H13: kernel-path flags (`triton_enabled = True`, `use_flash_attn=True`) that choose a CUDA-only path.

One hazard class, one module: detector, fix (the reason it is manual), its knowledge-base topic
(see docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.rules.base import BLOCKS, MEDIUM, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes
from sandbox.cuda_only import BY_MODULE

# A flag that switches on a CUDA-only kernel path, by its name.
KERNEL_FLAG = re.compile(
    r"^_?(use_|enable_|has_)?(triton|flash_?attn\w*|flash_attention\w*|xformers|apex|fused_\w+|cuda_kernels?|"
    r"cutlass|bnb|bitsandbytes|liger)(_enabled|_available|_kernels?)?$", re.I)


def _is_true(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _h13_flags(ctx: ModuleContext) -> None:
    for node in walk_nodes(ctx.module):
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
    manual={"kernel-path-flag": "the flag is the model's configuration; the import guard (H3) sets HAS_* flags "
                                "False where the library is missing, other flags are the user's choice"},
    kb_topic="recipe:H13",
    recipe="knowledge/recipes/H13.md",
    left_as_written="the flag stays as configured; where the library is missing the torch path runs",
    fixtures=("tests/test_new_hazards.py",),
)
