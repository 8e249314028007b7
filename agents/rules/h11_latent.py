"""H11: latent bugs a new backend exposes (cuda-else-cpu device fallbacks, mixed-device cat, writes into expanded views,
auxiliary tensors made on the CPU in the forward path).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from agents.models import Frame, StructuredException
from agents.rules.base import (
    BLOCKS,
    HIGH,
    LOW,
    MEDIUM,
    NUMBERS,
    ErrorPattern,
    Fix,
    HazardRule,
    Signature,
)
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import (
    last_name,
    walk_nodes,
)
from agents.rules.h1_cuda_device import device_agnostic
from agents.rules.h11_aux_device import aux_sites, aux_tensors_on_device
from agents.rules.kit import (
    CodemodResult,
    Rewriter,
    dotted_name,
    run_codemod,
)

# --- detector ----------------------------------------------------------------------------------

def _h11_latent(ctx: ModuleContext) -> None:
    for node in ctx.fallback_devices:
        ctx.add("H11", "device-fallback-to-cpu", node,
                "device check falls back to \"cpu\" when CUDA is absent: on Ascend it silently picks the CPU "
                "while the model and inputs are on the NPU (device-mismatch errors or a slow CPU run); ask "
                "for the NPU too, or take the device from the model's parameters", BLOCKS, HIGH)
    flow = ctx.flow
    for call, origins in flow.mixed_cats:
        ctx.add("H11", "mixed-device-cat", call,
                f"`{last_name(call.func)}` joins tensors from different places ({', '.join(sorted(origins))}): "
                "once CUDA is gone they land on different devices and the op fails", BLOCKS, MEDIUM)
    for node in flow.inplace_expanded:
        ctx.add("H11", "inplace-on-expanded-view", node,
                "in-place write into an expanded (broadcast) view: many elements share one memory location, "
                "and on Ascend non-contiguous views may be copied for the kernel, so the write can be lost or "
                "fail; .clone() (or .contiguous()) first", NUMBERS, MEDIUM)
    for call, anchor, hot in aux_sites(ctx):
        what = ctx.code(call).strip()
        what = what if len(what) <= 60 else what[:57] + "..."
        ctx.add("H11", "aux-tensor-device", call,
                f"`{what}` is made on the CPU (no device=) in {hot}()'s path: beside inputs on the NPU it is a "
                "device-mismatch error or a host-to-device copy every step"
                + (f"; fix: device={anchor if anchor == 'device' else anchor + '.device'}" if anchor else
                   "; left as written: no tensor argument of this function to take the device from"),
                BLOCKS, MEDIUM if anchor else LOW, fixable=anchor is not None)
    for call in flow.masked_scatter_cuda:
        site = _mask_cuda_move(ctx, call)
        where = "" if site is call else f" (the mask of masked_scatter at line {ctx.pos(call)[0]}, moved here)"
        ctx.add("H11", "masked-scatter-device", site,
                f"masked_scatter with a mask moved by `.cuda()`{where}: once ported, mask and tensor must be on the "
                "same device (and the mask bool, same shape); move the mask with `.to(x.device)`", BLOCKS, HIGH)


def _mask_cuda_move(ctx: ModuleContext, call: cst.Call) -> cst.CSTNode:
    """The `.cuda()` that moved the mask (in the argument, or in the mask variable's definition): the fix
    rewrites that line."""
    if not call.args:
        return call
    mask = call.args[0].value

    def cuda_in(e: cst.CSTNode) -> cst.CSTNode | None:
        return next((n for n in walk_nodes(e) if isinstance(n, cst.Call) and last_name(n.func) == "cuda"), None)

    if cuda_in(mask) is not None:
        return call
    fn = ctx.function_of(call)
    if isinstance(mask, cst.Name) and fn is not None:
        line = ctx.pos(call)[0]
        defs = [n for n in walk_nodes(fn) if isinstance(n, cst.Assign) and ctx.pos(n)[0] < line
                and any(isinstance(t.target, cst.Name) and t.target.value == mask.value for t in n.targets)]
        if defs and (hit := cuda_in(defs[-1].value)) is not None:
            return hit
    return call


# --- fix ---------------------------------------------------------------------------------------

SAME_DEVICE_HELPER = '''
def _npuport_same_device(tensors):
    """Moves tensors to one device, the first non-CPU one among them (hazard H11: inputs that a
    CUDA host kept together can land on different devices once the device is fixed)."""
    devices = [t.device for t in tensors if t.device.type != "cpu"]
    return [t.to(devices[0]) for t in tensors] if devices else list(tensors)
'''


class AlignDevices(Rewriter):
    """H11: a torch.cat / torch.stack whose inputs sit on different devices, at one line."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted_name(updated.func)
        if self.line_of(original) != self.line or name not in ("torch.cat", "torch.stack", "torch.concat"):
            return updated
        if not updated.args or updated.args[0].keyword is not None:
            return updated
        first = updated.args[0]
        wrapped = cst.Call(func=cst.Name("_npuport_same_device"), args=[cst.Arg(first.value)])
        self.note(original, f"{name} inputs moved to one device with _npuport_same_device")
        return updated.with_changes(args=[first.with_changes(value=wrapped), *updated.args[1:]])


def align_devices(source: str, *, line: int, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: AlignDevices(line), [(SAME_DEVICE_HELPER, "def _npuport_same_device(")])


def _device_mismatch(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    if "Expected all tensors to be on the same device" in exc.message:
        return Signature("device-mismatch", f"device-mismatch@{where}", f"tensors on different devices meet at {where}",
                         frame)
    return None


def _line_param(sig: Signature) -> dict[str, Any]:
    return {"line": sig.frame.line} if sig.frame else {}


RULE = HazardRule(
    hazard="H11",
    title="Latent bugs a new backend exposes",
    detect=_h11_latent,
    fixes=(
        Fix("device-agnostic", device_agnostic, "device-agnostic code instead of hard-coded CUDA",
            frozenset({"device-fallback-to-cpu", "masked-scatter-device"}), order=30),
        Fix("aux-tensors-on-device", aux_tensors_on_device,
            "auxiliary tensors made in the forward path on the device of the tensor they are used with",
            frozenset({"aux-tensor-device"}), order=35),
        Fix("align-devices", align_devices, "move torch.cat/stack inputs to one device", order=55),  # after a run only
    ),
    manual={
        "mixed-device-cat": "fixed after a run, where it fails: the device-mismatch error names the line and "
                            "align-devices moves the inputs to one device",
        "inplace-on-expanded-view": "whether to clone first depends on whether the write was meant to be shared",
    },
    explains=(ErrorPattern("device-mismatch", _device_mismatch, "mixed devices", fix="align-devices",
                           params=_line_param, order=30),),
    kb_topic="recipe:H11",
    left_as_written="the device fix puts both sides on the port's device; validated by the run",
    fixtures=("tests/test_scanner.py", "tests/test_codemods.py", "examples/tiny_llm"),
)
