"""H2: CUDA autocast / AMP (torch.cuda.amp, autocast("cuda"), the GPU autocast state).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from agents.rules.base import (
    BLOCKS,
    HIGH,
    MEDIUM,
    NUMBERS,
    Fix,
    HazardRule,
)
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import (
    kwarg,
    positional,
    string_value,
)
from agents.rules.kit import (
    DEVICE_TYPE,
    CodemodResult,
    Rewriter,
    dotted_name,
    is_cuda_string,
    run_codemod,
)
from agents.rules.kit_device import DEVICE_HELPERS

# --- detector ----------------------------------------------------------------------------------

def _h2_autocast(ctx: ModuleContext) -> None:
    for ref in ctx.refs:
        q = ref.qual
        if q.startswith("torch.cuda.amp"):
            last = q.rsplit(".", 1)[-1]
            if last == "autocast":
                ctx.add("H2", "cuda-autocast", ref.node,
                        "`torch.cuda.amp.autocast` without CUDA turns itself off with a warning, so the model "
                        "silently runs in float32 (other numbers, slower); use torch.autocast(\"npu\", ...) or "
                        "torch.npu.amp.autocast", NUMBERS, HIGH)
            elif last == "GradScaler":
                ctx.add("H2", "cuda-grad-scaler", ref.node,
                        "`torch.cuda.amp.GradScaler` is CUDA-only; use torch.npu.amp.GradScaler", BLOCKS, MEDIUM)
            else:
                ctx.add("H2", "cuda-amp", ref.node,
                        f"`{q}` is CUDA AMP; torch_npu has the same under torch.npu.amp", BLOCKS, MEDIUM)
        elif q in ("torch.get_autocast_gpu_dtype", "torch.set_autocast_gpu_dtype", "torch.is_autocast_enabled",
                   "torch.set_autocast_enabled"):
            call = ctx.parent(ref.node)
            nargs = len(call.args) if isinstance(call, cst.Call) and call.func is ref.node else -1
            gpu_form = "gpu" in q or (q.endswith("is_autocast_enabled") and nargs == 0) or (
                q.endswith("set_autocast_enabled") and nargs == 1)
            if gpu_form:
                ctx.add("H2", "autocast-gpu-state", ref.node,
                        f"`{q.removeprefix('torch.')}` reads/sets the CUDA autocast state, not the NPU's: under "
                        "NPU autocast it reports the wrong dtype/flag; pass the device: "
                        "torch.get_autocast_dtype(\"npu\") / torch.is_autocast_enabled(\"npu\")", NUMBERS, MEDIUM)
    for call in ctx.ix.calls:
        q = ctx.qual(call.func)
        if q in ("torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.amp.autocast_mode.autocast"):
            dev = kwarg(call, "device_type") or kwarg(call, "device")
            value = string_value(dev.value) if dev else string_value(positional(call, 0) or cst.Name("x"))
            if value == "cuda":
                rule = "cuda-grad-scaler" if q.endswith("GradScaler") else "cuda-autocast"
                ctx.add("H2", rule, call,
                        f"`{q}` with device \"cuda\": without CUDA it is disabled with a warning, so the model "
                        "silently runs in full precision; use device \"npu\"", NUMBERS, HIGH)


# --- fix ---------------------------------------------------------------------------------------

# torch.cuda.amp.autocast's positional parameters, in order; its dtype defaults to float16, and so does
# torch.autocast("cuda")'s, while torch.autocast("cpu"/"npu") would default to bfloat16: the rewrite names it.
_CUDA_AMP_PARAMS = ("enabled", "dtype", "cache_enabled")
_CUDA_DEFAULT_DTYPE = "torch.float16"


_EQ = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _with_dtype(args: list[cst.Arg]) -> list[cst.Arg]:
    if any(a.keyword is not None and a.keyword.value == "dtype" for a in args):
        return args
    return [*args, cst.Arg(keyword=cst.Name("dtype"), value=cst.parse_expression(_CUDA_DEFAULT_DTYPE),
                           equal=_EQ)]


def _no_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]


class CudaAutocast(Rewriter):
    """H2: CUDA autocast -> autocast on the port's device type, with the dtype and flags CUDA's meant."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted_name(updated.func)
        if name == "torch.cuda.amp.autocast":
            kept: list[cst.Arg] = []
            for i, a in enumerate(updated.args):
                if a.keyword is None and a.star == "" and i < len(_CUDA_AMP_PARAMS):
                    a = a.with_changes(keyword=cst.Name(_CUDA_AMP_PARAMS[i]), equal=_EQ)
                kept.append(a)
            self.note(original, "torch.cuda.amp.autocast -> torch.autocast(_npuport_device().type, dtype=...)")
            return updated.with_changes(
                func=cst.parse_expression("torch.autocast"),
                args=_no_commas([cst.Arg(DEVICE_TYPE), *_with_dtype(kept)]),
            )
        if name == "torch.autocast":
            args = list(updated.args)
            cuda = False
            for i, a in enumerate(args):
                is_device_arg = (a.keyword is None and i == 0) or (a.keyword is not None
                                                                   and a.keyword.value == "device_type")
                if is_device_arg and is_cuda_string(a.value):
                    args[i] = a.with_changes(value=DEVICE_TYPE)
                    cuda = True
                    self.note(original, 'torch.autocast("cuda") -> torch.autocast(_npuport_device().type, dtype=...)')
            if cuda:
                positional_dtype = len([a for a in args if a.keyword is None]) >= 2
                args = args if positional_dtype else _no_commas(_with_dtype(args))
            return updated.with_changes(args=args)
        if name == "torch.get_autocast_gpu_dtype":
            self.note(original, "torch.get_autocast_gpu_dtype() -> torch.get_autocast_dtype(device type)")
            return cst.parse_expression("torch.get_autocast_dtype(_npuport_device().type)")
        return updated


def cuda_autocast(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: CudaAutocast(), [(DEVICE_HELPERS, "def _npuport_device(")])


RULE = HazardRule(
    hazard="H2",
    title="CUDA autocast / AMP",
    detect=_h2_autocast,
    fixes=(Fix("cuda-autocast", cuda_autocast, "autocast on the port's device instead of CUDA",
               frozenset({"cuda-autocast"}), order=20),),
    manual={
        "cuda-grad-scaler": "training only: the NPU GradScaler has its own options",
        "cuda-amp": "other torch.cuda.amp APIs have torch.npu.amp twins; inference ports rarely need them",
        "autocast-gpu-state": "reads/sets autocast state: the device to ask about is the caller's choice",
    },
    kb_topic="recipe:H2",
    fixtures=("tests/test_scanner.py", "tests/test_codemods.py", "examples/ocr_mini"),
)
