"""H6: host syncs and Python loops in the hot path (.item(), .tolist(), dynamic shapes, per-expert and element-wise loops).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import libcst as cst

from agents.rules.base import (
    HIGH,
    LOW,
    MEDIUM,
    SLOWS,
    Fix,
    HazardRule,
)
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import (
    dotted,
    last_name,
    walk_nodes,
)
from agents.rules.h6_codemods import moe_dense_dispatch, vectorise_mask_loops

# H6: host-sync method calls -> (rule, note)
SYNC_METHODS: dict[str, tuple[str, str]] = {
    "item": ("item-sync", "`.item()` copies a value to the host and waits for every queued NPU op"),
    "tolist": ("tolist-sync", "`.tolist()` copies the tensor to the host and waits for the device"),
    "numpy": ("numpy-sync", "`.numpy()` needs a host tensor: the preceding `.cpu()` copies and waits for "
                            "the device"),
}
# bincount's length is max(input) + 1 (at least minlength): data-dependent as well
DYNAMIC_SHAPE_OPS = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}


# --- detector ----------------------------------------------------------------------------------

def _h6_host_sync(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if not isinstance(f, cst.Attribute) or ctx.is_module_ref(f.value):
            q = ctx.qual(f)
            if q in ("torch.nonzero", "torch.argwhere", "torch.masked_select", "torch.unique", "torch.bincount") or (
                    q == "torch.where" and len(call.args) == 1):
                _h6_dynamic(ctx, call, q)
            continue
        name = f.attr.value
        hot = ctx.in_hot_path(call)
        where = f" in {hot}()" if hot else ""
        if name in SYNC_METHODS and not call.args:
            rule, note = SYNC_METHODS[name]
            ctx.add("H6", rule, call, f"{note}{where}; on Ascend each sync stalls the NPU pipeline"
                    + (" at every step" if hot else ""), SLOWS, MEDIUM if hot else LOW)
        elif name in DYNAMIC_SHAPE_OPS:
            _h6_dynamic(ctx, call, f".{name}()")
    for loop in ctx.ix.fors:
        _h6_loop(ctx, loop)


def _h6_dynamic(ctx: ModuleContext, call: cst.Call, what: str) -> None:
    hot = ctx.in_hot_path(call)
    ctx.add("H6", "dynamic-shape-sync", call,
            f"`{what}` has a data-dependent output size: the host waits for the device to learn it"
            + (f" (in {hot}())" if hot else "") + "; on Ascend it also forces shape recompilation",
            SLOWS, MEDIUM if hot else LOW)


def _range_loop_vars(loop: cst.For) -> set[str]:
    it = loop.iter
    if isinstance(it, cst.Call) and last_name(it.func) in ("range", "enumerate", "zip"):
        return {n.value for n in walk_nodes(loop.target) if isinstance(n, cst.Name)}
    return set()


def _h6_loop(ctx: ModuleContext, loop: cst.For) -> None:
    hot = ctx.in_hot_path(loop)
    where = f" in {hot}()" if hot else ""
    iter_code = ctx.code(loop.iter)
    if "expert" in iter_code.lower():
        ctx.add("H6", "per-expert-loop", loop,
                f"Python loop over experts{where}: one small matmul (and often a nonzero/where sync) per expert; "
                "on Ascend group them with npu_moe_init_routing + npu_grouped_matmul", SLOWS,
                HIGH if hot else MEDIUM)
        return
    if not _range_loop_vars(loop):
        return
    # element-wise tensor building: `t[i, j] = ...` indexed by this loop's variables (or outer ones)
    outer = _outermost_range_loop(ctx, loop)
    loop_vars: set[str] = set()
    for a in [loop, *[a for a, _ in ctx.ancestors(loop) if isinstance(a, cst.For)]]:
        loop_vars |= _range_loop_vars(a)
    tensors = _tensor_names(ctx, loop)
    for node in walk_nodes(loop.body):
        if isinstance(node, cst.AssignTarget | cst.AugAssign) and isinstance(node.target, cst.Subscript):
            target = node.target
            idx = {n.value for el in target.slice for n in walk_nodes(el) if isinstance(n, cst.Name)}
            # a tensor made with torch.* here, or 2-D indexing: not a Python list filled by index
            tensor_like = dotted(target.value) in tensors or len(target.slice) >= 2
            if idx & loop_vars and tensor_like:
                ctx.add("H6", "elementwise-loop", outer,
                        f"Python loop writes tensor elements one at a time (`{ctx.code(target).strip()} = "
                        f"...`){where}: each write is a tiny device op; build it with vectorised ops (arange "
                        "comparisons, tril/triu, masked_fill)", SLOWS, HIGH if hot else MEDIUM)
                return


def _tensor_names(ctx: ModuleContext, node: cst.CSTNode) -> set[str]:
    """Names assigned from a torch.* call in the function around node (or the module)."""
    scope: cst.CSTNode = ctx.function_of(node) or ctx.module
    out: set[str] = set()
    for n in walk_nodes(scope):
        if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and ctx.qual(n.value.func).startswith("torch."):
            out |= {d for t in n.targets if (d := dotted(t.target))}
    return out


def _outermost_range_loop(ctx: ModuleContext, loop: cst.For) -> cst.For:
    best = loop
    for a, _ in ctx.ancestors(loop):
        if isinstance(a, cst.FunctionDef | cst.ClassDef):
            break
        if isinstance(a, cst.For) and _range_loop_vars(a):
            best = a
    return best


RULE = HazardRule(
    hazard="H6",
    title="Host syncs and Python loops in the hot path",
    detect=_h6_host_sync,
    fixes=(
        Fix("vectorise-mask-loops", vectorise_mask_loops,
            "element-wise tensor fill loops -> vectorised masked_fill_", frozenset({"elementwise-loop"}), order=60),
        Fix("moe-dense-dispatch", moe_dense_dispatch, "MoE dispatch without host syncs or per-expert batches",
            frozenset({"per-expert-loop", "numpy-sync", "item-sync"}), order=70),
    ),
    manual={
        "tolist-sync": "copying to the host is usually the point of .tolist(); moving it out of the loop is a design change",
        "dynamic-shape-sync": "a data-dependent output size needs a static-shape rewrite of the algorithm",
    },
    kb_topic="recipe:H6",
    recipe="knowledge/recipes/H6.md",
    left_as_written="a performance issue (host syncs / Python loops); the port is correct with it",
    fixtures=("tests/test_scanner.py", "tests/test_perf_codemods.py", "examples/tiny_llm"),
)
