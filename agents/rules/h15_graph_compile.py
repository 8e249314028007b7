"""H15: CUDA graphs and torch.compile modes that capture CUDA graphs ("reduce-overhead", "max-autotune"),
and TorchScript's legacy executor switched on (``torch._C._jit_set_profiling_executor(False)``): its graph
fuser knows only CPU and CUDA and raises "Unknown device for graph fuser" on an NPU tensor.

One hazard class, one module: detector, fix (codemod: eager, with the reason), its knowledge-base topic
(see docs/rules.md)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from agents.rules.base import BLOCKS, HIGH, MEDIUM, SLOWS, Fix, HazardRule
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import kwarg, string_value
from agents.rules.kit import CodemodResult, Rewriter, dotted_name, run_codemod

GRAPH_MODES = {"reduce-overhead", "max-autotune"}
# switching these off selects the legacy executor and its CPU/CUDA-only graph fuser
LEGACY_JIT_SWITCHES = {"torch._C._jit_set_profiling_executor", "torch._C._jit_set_profiling_mode"}
CUDA_GRAPH_APIS = {"torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.make_graphed_callables",
                   "torch.cuda.graphs.CUDAGraph", "torch.cuda.graphs.graph"}


def _graph_mode(call: cst.Call) -> str | None:
    mode = kwarg(call, "mode")
    value = string_value(mode.value) if mode is not None else None
    return value if value in GRAPH_MODES else None


def _h15_graphs(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        if ctx.qual(call.func) == "torch.compile" and (mode := _graph_mode(call)):
            ctx.add("H15", "compile-graph-mode", call,
                    f"torch.compile(mode=\"{mode}\") captures CUDA graphs (inductor's cudagraphs): the NPU has its "
                    "own graph mode (torchair); the port runs eager", SLOWS, MEDIUM)
        elif ctx.qual(call.func) in LEGACY_JIT_SWITCHES and _switched_off(call):
            ctx.add("H15", "legacy-jit-fuser", call,
                    f"`{ctx.code(call.func).strip()}(False)` selects TorchScript's legacy executor, whose graph fuser "
                    "knows only CPU and CUDA: a scripted function on an NPU tensor raises \"Unknown device for graph "
                    "fuser\"; the port keeps the default (profiling) executor", BLOCKS, HIGH)
    for ref in ctx.refs:
        if ref.qual in CUDA_GRAPH_APIS:
            ctx.add("H15", "cuda-graph", ref.node,
                    f"`{ref.qual}` captures a CUDA graph: the NPU's is torch.npu.NPUGraph where torch_npu has it; "
                    "else the captured code must run eagerly", BLOCKS, HIGH)


def _switched_off(call: cst.Call) -> bool:
    return len(call.args) == 1 and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == "False"


class DefaultJitExecutor(Rewriter):
    """torch._C._jit_set_profiling_executor(False) / _jit_set_profiling_mode(False) -> (True): the default
    executor; scripted functions compute the same, fused by a fuser that skips devices it does not know."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted_name(updated.func)
        if name and name.rsplit(".", 1)[-1] in {q.rsplit(".", 1)[-1] for q in LEGACY_JIT_SWITCHES} \
                and _switched_off(updated):
            self.note(original, f"{name}(False) -> (True): the legacy executor's fuser knows only CPU and CUDA")
            return updated.with_changes(args=[updated.args[0].with_changes(value=cst.Name("True"))])
        if name and name.rsplit(".", 1)[-1] == "_jit_override_can_fuse_on_cpu" and _switched_on(updated):
            # the default executor fuses CPU code with NNC, which needs LLVM, and torch's wheels have none
            # ("LLVM Backend not found" on the cpu target); the legacy fuser used a C compiler instead
            self.note(original, f"{name}(True) -> (False): the default executor's CPU fuser needs LLVM, which "
                                "torch's wheels lack")
            return updated.with_changes(args=[updated.args[0].with_changes(value=cst.Name("False"))])
        return updated


def _switched_on(call: cst.Call) -> bool:
    return len(call.args) == 1 and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == "True"


def default_jit_executor(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: DefaultJitExecutor())


class CompileEager(Rewriter):
    """torch.compile(m, mode="reduce-overhead") -> m; @torch.compile(mode=...) dropped: eager runs the same code."""

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator) -> cst.Decorator | cst.RemovalSentinel:
        d = updated.decorator
        if isinstance(d, cst.Call) and dotted_name(d.func) == "torch.compile" and _graph_mode(d) \
                and all(a.keyword is not None for a in d.args):
            self.note(original, f"@torch.compile(mode=\"{_graph_mode(d)}\") dropped: CUDA-graph capture; eager")
            return cst.RemoveFromParent()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if dotted_name(updated.func) == "torch.compile" and _graph_mode(updated) and updated.args \
                and updated.args[0].keyword is None:
            self.note(original, f"torch.compile(..., mode=\"{_graph_mode(updated)}\") -> eager: CUDA-graph capture")
            return updated.args[0].value
        return updated


def compile_eager(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: CompileEager())


RULE = HazardRule(
    hazard="H15",
    title="CUDA graphs and torch.compile graph modes",
    detect=_h15_graphs,
    fixes=(Fix("compile-eager", compile_eager, "eager instead of torch.compile's CUDA-graph modes",
               frozenset({"compile-graph-mode"}), order=40),
           Fix("default-jit-executor", default_jit_executor, "TorchScript's default executor instead of the legacy "
               "one (its graph fuser knows only CPU and CUDA)", frozenset({"legacy-jit-fuser"}), order=40)),
    manual={"cuda-graph": "the device-agnostic rewrite (H1) uses NPUGraph where torch_npu has it, else an eager "
                          "stand-in whose replay cannot rerun the captured code: a person moves it to eager"},
    kb_topic="recipe:H15",
    left_as_written="runs eager: the same numbers without graph capture",
    fixtures=("tests/test_new_hazards.py",),
)
