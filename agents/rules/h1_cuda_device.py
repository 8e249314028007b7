"""H1: hard-coded CUDA device and torch.cuda API (`.cuda()`, device="cuda", torch.cuda.*, cuDNN flags).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst
import libcst.matchers as m

from agents.models import Finding, Frame, HazardCategory, Severity, StructuredException
from agents.rules import h1_config_device
from agents.rules.base import (
    BLOCKS,
    HIGH,
    LOW,
    MEDIUM,
    NUMBERS,
    SLOWS,
    ErrorPattern,
    Fix,
    HazardRule,
    Signature,
)
from agents.rules.context import ModuleContext, TextFile
from agents.rules.cst_helpers import (
    dotted,
    is_cuda_device_string,
    last_name,
    string_value,
)
from agents.rules.kit import (
    DEVICE_CALL,
    DEVICE_TYPE,
    CodemodResult,
    Rewriter,
    code_of,
    dotted_name,
    is_cuda_string,
    run_codemod,
)
from agents.rules.kit_device import DEVICE_HELPERS

# H1: torch.cuda.<api> -> (severity, note). Anything else under torch.cuda gets the default note.
TORCH_CUDA_API: dict[str, tuple[Severity, str]] = {
    "is_available": (MEDIUM, "returns False on an Ascend host, so the code behind it silently takes its "
                             "non-GPU branch; ask torch.npu.is_available() instead"),
    "device_count": (MEDIUM, "is 0 on an Ascend host; use torch.npu.device_count()"),
    "get_device_name": (MEDIUM, "fails without CUDA; use torch.npu.get_device_name()"),
    "get_device_properties": (MEDIUM, "fails without CUDA; use torch.npu.get_device_properties()"),
    "get_device_capability": (MEDIUM, "asks for a CUDA compute capability, which an NPU does not have: "
                                      "torch.npu.get_device_capability() returns None"),
    "synchronize": (HIGH, "raises without CUDA; use torch.npu.synchronize()"),
    "empty_cache": (LOW, "is a no-op without CUDA and frees nothing on the NPU; use torch.npu.empty_cache()"),
    "set_device": (HIGH, "raises without CUDA; use torch.npu.set_device()"),
    "current_device": (HIGH, "raises without CUDA; use torch.npu.current_device()"),
    "manual_seed": (LOW, "seeds only CUDA generators, so NPU random streams stay unseeded; "
                         "use torch.npu.manual_seed() or torch.manual_seed()"),
    "manual_seed_all": (LOW, "seeds only CUDA generators; use torch.npu.manual_seed_all()"),
    "Event": (HIGH, "CUDA events cannot time NPU work; use torch.npu.Event"),
    "Stream": (HIGH, "CUDA streams do not exist on the NPU; use torch.npu.Stream"),
    "stream": (HIGH, "CUDA stream context; use torch.npu.stream"),
    "current_stream": (HIGH, "CUDA stream query; use torch.npu.current_stream()"),
    "memory_allocated": (LOW, "reports CUDA memory only; use torch.npu.memory_allocated()"),
    "max_memory_allocated": (LOW, "reports CUDA memory only; use torch.npu.max_memory_allocated()"),
    "memory_reserved": (LOW, "reports CUDA memory only; use torch.npu.memory_reserved()"),
    "max_memory_reserved": (LOW, "reports CUDA memory only; use torch.npu.max_memory_reserved()"),
    "reset_peak_memory_stats": (LOW, "resets CUDA memory stats only; use torch.npu.reset_peak_memory_stats()"),
    "mem_get_info": (MEDIUM, "raises without CUDA; use torch.npu.mem_get_info()"),
    "memory_summary": (LOW, "reports CUDA memory only; use torch.npu.memory_summary()"),
    "graphs": (HIGH, "CUDA graphs do not exist on the NPU (torch.npu has its own graph capture)"),
    "CUDAGraph": (HIGH, "CUDA graphs do not exist on the NPU (torch.npu has its own graph capture)"),
    "FloatTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
    "HalfTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
    "LongTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
    "BoolTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
}
# torch.cuda names whose NPU form differs (torch_npu's native-API list, "NPU 形式名称"); the others keep
# their name under torch.npu. tests/test_codemods.py checks every emitted name against that list.
NPU_NAMES: dict[str, str] = {"CUDAGraph": "NPUGraph"}
# NPU APIs that only newer torch_npu builds have: reached through _npuport_api(), which falls back to the
# eager CPU stand-in when the NPU module lacks them.
NPU_OPTIONAL = frozenset({"NPUGraph", "graph", "make_graphed_callables", "graph_pool_handle", "nvtx"})
# torch.cuda APIs whose torch_npu form returns something else than CUDA's contract (torch_npu's native-API
# notes): get_device_capability() is None unless TORCH_NPU_DEVICE_CAPABILITY is set, and
# get_device_properties() leaves major/minor/multi_processor_count empty. The rewrite calls an adapter that
# returns what the CUDA code reads ((0, 0): no CUDA compute capability), never the raw NPU value.
NPU_ADAPTERS: dict[str, str] = {"get_device_capability": "_npuport_device_capability",
                                "get_device_properties": "_npuport_device_properties"}
TORCH_CUDA_DEFAULT = (HIGH, "needs a CUDA build and GPU; torch_npu offers the same call under torch.npu")

# H1: torch.backends.cudnn / torch.backends.cuda flags -> (category, note)
BACKEND_FLAGS: dict[str, tuple[HazardCategory, str]] = {
    "deterministic": (NUMBERS, "only makes cuDNN deterministic; NPU determinism is set with "
                               "torch.use_deterministic_algorithms() and torch_npu's own options"),
    "benchmark": (SLOWS, "tunes cuDNN kernels only; it does nothing on the NPU"),
    "allow_tf32": (NUMBERS, "TF32 is a CUDA matmul mode; the NPU's analogue is torch.npu.matmul.allow_hf32"),
    "enabled": (SLOWS, "switches cuDNN only; it does nothing on the NPU"),
    "sdp_kernel": (SLOWS, "selects CUDA SDPA kernels; it does not choose the NPU fused attention"),
}


# --- detector ----------------------------------------------------------------------------------

def _h1_cuda_device(ctx: ModuleContext) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "cuda" and not ctx.is_module_ref(f.value):
            ctx.add("H1", "cuda-call", call,
                    "`.cuda()` moves the tensor/module to a CUDA GPU: without CUDA it raises \"Torch not compiled "
                    "with CUDA enabled\"; move to the run's device (`.to(device)`, `npu` on Ascend)", BLOCKS, HIGH)
    for s in ctx.ix.strings:
        value = string_value(s)
        if is_cuda_device_string(value):
            _h1_cuda_string(ctx, s, value or "")
        elif value == "CUDA_VISIBLE_DEVICES":
            ctx.add("H1", "cuda-visible-devices", s,
                    "CUDA_VISIBLE_DEVICES selects GPUs only; Ascend reads ASCEND_RT_VISIBLE_DEVICES, so device "
                    "selection silently stops working", BLOCKS, MEDIUM)
    for ref in ctx.refs:
        q = ref.qual
        if q == "torch.cuda" or (q.startswith("torch.cuda.") and not q.startswith(("torch.cuda.amp",
                                                                                    "torch.cuda.nccl"))):
            api = q.split(".")[2] if q.count(".") >= 2 else ""
            sev, note = TORCH_CUDA_API.get(api, TORCH_CUDA_DEFAULT)
            ctx.add("H1", "torch-cuda-api", ref.node, f"`{q}` {note}", BLOCKS, sev)
        elif q.startswith(("torch.backends.cudnn.", "torch.backends.cuda.")):
            flag = next((p for p in reversed(q.split(".")) if p in BACKEND_FLAGS), "")
            cat, note = BACKEND_FLAGS.get(flag, (SLOWS, "configures CUDA/cuDNN only; it does nothing on the NPU"))
            rule = "cudnn-flags" if ".cudnn." in q else "cuda-backend-flags"
            ctx.add("H1", rule, ref.node, f"`{q}` {note}", cat, LOW)


def _h1_cuda_string(ctx: ModuleContext, s: cst.CSTNode, value: str) -> None:
    where = _device_string_context(ctx, s)
    if where == "compare":
        ctx.add("H1", "cuda-device-check", s,
                f"compares a device (type) with \"{value}\": on Ascend the type is \"npu\", so this branch is "
                "never taken there", NUMBERS, MEDIUM)
    elif where is not None:
        ctx.add("H1", "cuda-device-string", s,
                f"device \"{value}\" ({where}) is hard-coded: without CUDA it raises; use the run's device "
                "(\"npu\" on Ascend)", BLOCKS, HIGH)


def _device_string_context(ctx: ModuleContext, s: cst.CSTNode) -> str | None:
    """Where a "cuda" string is used as a device, or None when it is just text."""
    for a, _ in ctx.ancestors(s):
        if isinstance(a, cst.IfExp | cst.BooleanOperation):
            continue  # `"cuda" if ok else "cpu"`: look at what the whole expression feeds
        if isinstance(a, cst.Arg):
            if a.keyword is not None:
                kw = a.keyword.value
                return f"{kw}=" if kw in ("device", "map_location", "device_map") or kw.endswith("_device") \
                    else None
            call = ctx.parent(a)
            if isinstance(call, cst.Call):
                if ctx.qual(call.func) == "torch.device":
                    return "torch.device(...)"
                if last_name(call.func) in ("to", "set_default_device"):
                    return f".{last_name(call.func)}(...)"
            return None
        if isinstance(a, cst.Param):
            return "parameter default" if "device" in a.name.value else None
        if isinstance(a, cst.Assign | cst.AnnAssign):
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            names = " ".join(dotted(t) or "" for t in targets)
            return "assigned to a device variable" if "device" in names.lower() else None
        if isinstance(a, cst.Comparison | cst.ComparisonTarget):
            return "compare"
        return None
    return None


# --- fix ---------------------------------------------------------------------------------------

class DeviceAgnostic(Rewriter):
    """H1: .cuda(), device="cuda", torch.device("cuda"), torch.cuda.* -> the port's device."""

    def __init__(self) -> None:
        super().__init__()
        self._in_autocast = 0
        self._in_comparison = 0

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self._in_comparison += 1

    def visit_Call(self, node: cst.Call) -> None:
        if dotted_name(node.func) in ("torch.autocast", "torch.cuda.amp.autocast", "autocast"):
            self._in_autocast += 1

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        # x.device.type == "cuda"  ->  x.device.type == _npuport_device().type
        self._in_comparison -= 1
        comps = []
        changed = False
        for c in updated.comparisons:
            if is_cuda_string(c.comparator):
                comps.append(c.with_changes(comparator=DEVICE_TYPE))
                changed = True
            else:
                comps.append(c)
        left = updated.left
        if is_cuda_string(left):
            left, changed = DEVICE_TYPE, True
        if changed:
            self.note(original, "compare with the port's device type instead of 'cuda'")
            return updated.with_changes(left=left, comparisons=comps)
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = dotted_name(updated.func)
        if name in ("torch.autocast", "torch.cuda.amp.autocast", "autocast"):
            self._in_autocast -= 1
            return updated  # H2's codemod owns autocast
        # x.cuda(...) -> x.to(_npuport_device(), ...)
        if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "cuda" and name != "torch.cuda":
            kept = [a for a in updated.args if a.keyword is not None and a.keyword.value == "non_blocking"]
            self.note(original, ".cuda() -> .to(_npuport_device())")
            return updated.with_changes(
                func=updated.func.with_changes(attr=cst.Name("to")),
                args=[cst.Arg(DEVICE_CALL), *[a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in kept]],
            )
        # x.record_stream(s) -> _npuport_record_stream(x, s): CPU tensors have no stream to record on
        if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "record_stream" \
                and len(updated.args) == 1:
            self.note(original, "x.record_stream(s) -> _npuport_record_stream(x, s)")
            return cst.Call(func=cst.Name("_npuport_record_stream"),
                            args=[cst.Arg(updated.func.value),
                                  updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        # torch.device("cuda") -> _npuport_device()  (the literal inside was rewritten already)
        if name == "torch.device" and updated.args and m.matches(updated.args[0].value,
                                                                 m.Call(func=m.Name("_npuport_device"))):
            self.note(original, 'torch.device("cuda") -> _npuport_device()')
            return DEVICE_CALL
        # torch.cuda.X(...) -> _npuport_backend().X(...), under X's NPU name
        if name.startswith("torch.cuda.") and not name.startswith("torch.cuda.amp"):
            attr = name.split(".", 2)[2]
            head, _, rest = attr.partition(".")
            npu = NPU_NAMES.get(head, head)
            if head in NPU_ADAPTERS and not rest:
                target = NPU_ADAPTERS[head]
            elif npu in NPU_OPTIONAL:
                target = f'_npuport_api("{npu}")'
            else:
                target = f"_npuport_backend().{npu}"
            target += f".{rest}" if rest else ""
            self.note(original, f"torch.cuda.{attr} -> {target}")
            return updated.with_changes(func=cst.parse_expression(target))
        return updated

    def leave_Assert(self, original: cst.Assert, updated: cst.Assert) -> cst.BaseSmallStatement:
        # `assert torch.cuda.is_available()` means "the accelerator is there"; the port's device always is
        # (the NPU where present, else the CPU), so the assertion must hold on the target, not turn false.
        if "is_available" in code_of(original.test) and "cuda" in code_of(original.test):
            self.note(original, "assert torch.cuda.is_available() -> assert the port's device exists")
            return updated.with_changes(test=cst.parse_expression("_npuport_device() is not None"))
        return updated

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.BaseExpression:
        # Remaining "cuda" literals: device= keywords, .to("cuda"), device = "cuda" assignments.
        if updated.evaluated_value == "CUDA_VISIBLE_DEVICES":
            # Ascend selects cards with ASCEND_RT_VISIBLE_DEVICES; CUDA's variable means nothing there.
            self.note(original, "CUDA_VISIBLE_DEVICES -> ASCEND_RT_VISIBLE_DEVICES")
            return updated.with_changes(value=updated.value.replace("CUDA_VISIBLE_DEVICES",
                                                                    "ASCEND_RT_VISIBLE_DEVICES"))
        if self._in_autocast == 0 and self._in_comparison == 0 and is_cuda_string(updated):
            self.note(original, '"cuda" -> _npuport_device()')
            return DEVICE_CALL
        return updated


def device_agnostic(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: DeviceAgnostic(), [(DEVICE_HELPERS, "def _npuport_device(")])


def _h1_text(tf: TextFile) -> list[Finding]:
    out: list[Finding] = h1_config_device.detect(tf)  # "device": "cuda" in config.json
    for ln in tf.env_lines():
        m = re.search(r"\bCUDA_VISIBLE_DEVICES\s*=", ln.line)
        if m:
            out.append(tf.finding("H1", "cuda-visible-devices", ln.lineno, m.start(), ln.snippet,
                                  "CUDA_VISIBLE_DEVICES selects GPUs only; Ascend reads ASCEND_RT_VISIBLE_DEVICES",
                                  BLOCKS, MEDIUM))
    return out


def _cuda_assert(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    if "Torch not compiled with CUDA enabled" in exc.message or "Found no NVIDIA driver" in exc.message:
        return Signature("cuda-assert", f"cuda-assert@{where}", f"CUDA is called at {where}, and this host has none",
                         frame)
    return None


DEVICE_AGNOSTIC = Fix("device-agnostic", device_agnostic, "device-agnostic code instead of hard-coded CUDA",
                      frozenset({"cuda-call", "cuda-device-string", "torch-cuda-api", "cuda-visible-devices"}),
                      order=30)

RULE = HazardRule(
    hazard="H1",
    title="Hard-coded CUDA device and torch.cuda API",
    detect=_h1_cuda_device,
    detect_text=_h1_text,
    fixes=(DEVICE_AGNOSTIC,
           Fix("config-device", h1_config_device.config_device, "the CUDA device named in config.json -> the port's "
               "device", frozenset({h1_config_device.RULE_ID}), order=31)),
    manual={
        "cudnn-flags": "a cuDNN setting: it does nothing on the NPU; the NPU's own option (if any) is a choice",
        "cuda-backend-flags": "a CUDA backend setting: the NPU analogue (e.g. allow_hf32) is a numerics choice",
        "cuda-device-check": "a device-type comparison: which branch the NPU should take is a design choice "
                             "(device-agnostic rewrites it where the file has other H1 fixes)",
    },
    explains=(ErrorPattern("cuda-assert", _cuda_assert, "hard-coded CUDA", fix="device-agnostic", order=20),),
    kb_topic="recipe:H1",
    fixtures=("tests/test_scanner.py", "tests/test_codemods.py", "examples/ocr_mini",
              "tests/test_zoo_model_classes.py"),
)
