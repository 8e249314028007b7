"""H6: host syncs and Python loops in the hot path (.item(), .tolist(), dynamic shapes, per-expert and element-wise
loops).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import libcst as cst

from agents.models import Finding
from agents.rules.base import (
    HIGH,
    LOW,
    MEDIUM,
    SLOWS,
    Fix,
    HazardRule,
)
from agents.rules.config_json import json_key_line
from agents.rules.context import ModuleContext, TextFile
from agents.rules.cst_helpers import (
    dotted,
    last_name,
    walk_nodes,
)
from agents.rules.h6.codemods import vectorise_mask_loops
from agents.rules.h6.moe import MoePlan, expert_loop_var, moe_config_notes, moe_dense_dispatch, moe_plan
from knowledge.settings import settings

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
            fixable, why = _moe_fixable(ctx, call)
            if rule == "tolist-sync":
                fixable, why = False, ""
            elif not fixable:
                why = f"; left as written: {_sync_use(ctx, call)}"
            ctx.add("H6", rule, call, f"{note}{where}; on Ascend each sync stalls the NPU pipeline"
                    + (" at every step" if hot else "") + why, SLOWS, MEDIUM if hot else LOW, fixable=fixable)
        elif name in DYNAMIC_SHAPE_OPS:
            _h6_dynamic(ctx, call, f".{name}()")
    for loop in ctx.ix.fors:
        _h6_loop(ctx, loop)


def _moe_fixable(ctx: ModuleContext, node: cst.CSTNode) -> tuple[bool, str]:
    """Whether moe-dense-dispatch rewrites the function around node, else why not (the same analysis the
    codemod runs, so "fixable" is never claimed for a site the codemod leaves alone)."""
    fns = [a for a, _ in ctx.ancestors(node) if isinstance(a, cst.FunctionDef)]
    if not fns:
        return False, "it is not in a routed-experts function"
    plan = moe_plan(fns[0])
    if isinstance(plan, MoePlan):
        return True, ""
    return False, f"{fns[0].name.value}(): {plan}"


def _sync_use(ctx: ModuleContext, call: cst.Call) -> str:
    """What the host value is for: why removing the sync is a redesign, not a rewrite."""
    for a, child in ctx.ancestors(call):
        if isinstance(a, cst.If | cst.While | cst.IfExp) and child is a.test:
            return ("the value decides Python control flow (an `if`/`while` on a device value); keeping it on "
                    "the device means computing both branches or masking (torch.where), a change of algorithm")
        if isinstance(a, cst.Call) and last_name(a.func) in ("range", "zeros", "ones", "empty", "full", "arange",
                                                             "new_empty", "new_zeros", "view", "reshape", "split",
                                                             "narrow", "expand"):
            return "the value is used as a size or count: Ascend needs it on the host (a static shape would remove it)"
        if isinstance(a, cst.Subscript | cst.Slice):
            return "the value indexes or slices a tensor: a data-dependent shape that needs the host value"
        if isinstance(a, cst.SimpleStatementLine | cst.FunctionDef):
            break
    return "its Python number leaves the device; only a redesign that keeps it a tensor removes the sync"


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
    # over experts, or over per-expert counts (a tensor or list) with self.<experts>[i] called in the body
    if "expert" in ctx.code(loop.iter).lower() or expert_loop_var(loop) is not None:
        fixable, why = _moe_fixable(ctx, loop)
        training = next((a for a, child in ctx.ancestors(loop) if isinstance(a, cst.If) and child is not a.test
                         and "training" in ctx.code(a.test)), None)
        if training is not None:
            ctx.add("H6", "per-expert-loop", loop,
                    f"Python loop over experts{where}, under `if {ctx.code(training.test).strip()}`: inference never "
                    "takes it (the port validates inference); left as written", SLOWS, LOW, fixable=False)
            return
        ctx.add("H6", "per-expert-loop", loop,
                f"Python loop over experts{where}: one small matmul (and often a nonzero/where sync) per expert; "
                "on Ascend group them with npu_moe_init_routing + npu_grouped_matmul"
                + ("" if fixable else f"; moe-dense-dispatch leaves it as written: {why}"), SLOWS,
                HIGH if hot else MEDIUM, fixable=fixable)
        return
    if not _range_loop_vars(loop):
        return
    # element-wise tensor building: `t[i, j] = ...` indexed by this loop's variables (or outer ones)
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
                outer = _outermost_range_loop(ctx, loop, idx)
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


def _outermost_range_loop(ctx: ModuleContext, loop: cst.For, idx: set[str]) -> cst.For:
    """The outermost enclosing range/enumerate loop whose variables index the write (a loop around it that
    only repeats the fill per sample is not part of it)."""
    best = loop
    for a, _ in ctx.ancestors(loop):
        if isinstance(a, cst.FunctionDef | cst.ClassDef):
            break
        if isinstance(a, cst.For) and _range_loop_vars(a) & idx:
            best = a
    return best




def _h6_config(tf: TextFile) -> list[Finding]:
    """A model config with routed experts: which path moe-dense-dispatch's guard takes at its sizes."""
    config = tf.config_object()
    if config is None:
        return []
    out = []
    lines = tf.text.splitlines()
    for key, what in moe_config_notes(config, settings().moe_dense_max_ratio):
        line = json_key_line(tf.text, key)
        snippet = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        out.append(tf.finding("H6", "moe-dispatch-cost", line, 0, snippet,
                              f"MoE config `{key}`, where moe-dense-dispatch rewrites an expert loop (guarded: dense "
                              f"when experts <= R x top-k, else the original loop): {what}", SLOWS, LOW))
    return out


RULE = HazardRule(
    hazard="H6",
    title="Host syncs and Python loops in the hot path",
    detect=_h6_host_sync,
    detect_text=_h6_config,
    fixes=(
        Fix("vectorise-mask-loops", vectorise_mask_loops,
            "element-wise tensor fill loops -> vectorised masked_fill_", frozenset({"elementwise-loop"}), order=60),
        Fix("moe-dense-dispatch", moe_dense_dispatch, "MoE dispatch without host syncs or per-expert batches",
            frozenset({"per-expert-loop", "numpy-sync", "item-sync"}), order=70),
    ),
    manual={
        "tolist-sync": "copying to the host is usually the point of .tolist(); moving it out of the loop is a "
                       "design change",
        "dynamic-shape-sync": "a data-dependent output size needs a static-shape rewrite of the algorithm",
        "moe-dispatch-cost": "information: which MoE dispatch runs is decided when the code runs, from the expert "
                             "count and top-k (NPUPORT_MOE_DENSE_MAX_RATIO); nothing in the config changes",
    },
    report_only_rules=frozenset({"moe-dispatch-cost"}),
    kb_topic="recipe:H6",
    left_as_written="a performance issue (host syncs / Python loops); the port is correct with it",
    fixtures=("tests/test_scanner.py", "tests/test_perf_codemods.py", "examples/tiny_llm"),
)
