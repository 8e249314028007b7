"""H14: pinned host memory, asynchronous copies and `.is_cuda` branches.

One hazard class, one module: detector, fix (the reason it is manual), its knowledge-base topic
(see docs/rules.md)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from agents.rules.base import LOW, MEDIUM, NUMBERS, SLOWS, Fix, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes
from agents.rules.kit import CodemodResult, Rewriter, run_codemod


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _h14_host_memory(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "pin_memory" and not call.args \
                and not ctx.is_module_ref(f.value):
            ctx.add("H14", "pin-memory", call,
                    "`.pin_memory()` pins host memory through the CUDA allocator: without CUDA it raises or "
                    "does nothing; on Ascend torch_npu pins through the NPU (pin_memory(device=\"npu\"))", SLOWS, LOW)
        for a in call.args:
            if a.keyword is None or not _is_true(a.value):
                continue
            if a.keyword.value == "pin_memory":
                ctx.add("H14", "pin-memory-loader", a,
                        "`pin_memory=True` pins host memory for CUDA copies; on the CPU it "
                        "fails without CUDA, on Ascend it needs torch_npu", SLOWS, LOW)
            elif a.keyword.value == "non_blocking":
                ctx.add("H14", "non-blocking-copy", a,
                        "`non_blocking=True` copies asynchronously: reading the result on the host before a "
                        "device sync returns stale values on an NPU stream", NUMBERS, LOW)
    for node in walk_nodes(ctx.module):
        if isinstance(node, cst.If | cst.IfExp):
            for sub in walk_nodes(node.test):
                if isinstance(sub, cst.Attribute) and sub.attr.value == "is_cuda":
                    ctx.add("H14", "is-cuda-branch", node,
                            "branches on `.is_cuda`: NPU tensors are not CUDA tensors, so the port always takes "
                            "the other branch (test the device type the port runs on)", NUMBERS, MEDIUM)
                    break


PIN_HELPER_MARKER = "def _npuport_pin("
PIN_HELPER = '''

def _npuport_pin(t):
    """Pinned host memory where the device's allocator offers it, else the tensor as it is: pinning only
    speeds copies up, the values are the same (hazard H14)."""
    try:
        return t.pin_memory()
    except (RuntimeError, NotImplementedError):
        return t
'''


class GuardPinMemory(Rewriter):
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        f = updated.func
        if isinstance(f, cst.Attribute) and f.attr.value == "pin_memory" and not updated.args:
            self.note(original, "x.pin_memory() -> _npuport_pin(x): pinned where the device can pin")
            return cst.Call(func=cst.Name("_npuport_pin"), args=[cst.Arg(f.value)])
        return updated


def guard_pin_memory(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: GuardPinMemory(), [(PIN_HELPER, PIN_HELPER_MARKER)])


RULE = HazardRule(
    hazard="H14",
    title="Pinned memory, asynchronous copies and .is_cuda branches",
    detect=_h14_host_memory,
    fixes=(Fix("guard-pin-memory", guard_pin_memory, "pin host memory only where the device can",
               frozenset({"pin-memory"}), order=35),),
    manual={
        "pin-memory-loader": "pinning is a data-loader performance choice; torch_npu pins for the NPU when present",
        "non-blocking-copy": "correct when the result is synced before the host reads it; a person checks that",
        "is-cuda-branch": "which branch the NPU should take (the accelerator or the host path) is a design choice",
    },
    kb_topic="recipe:H14",
    left_as_written="kept: correct on the port's device, possibly slower",
    fixtures=("tests/test_new_hazards.py",),
)
