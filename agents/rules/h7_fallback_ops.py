"""H7: ops that fall back to the CPU on Ascend, read from the op-support matrix of the torch_npu build.

One hazard class, one module: detector, fix (the reason it is manual), the run-time errors it explains
and its knowledge-base topic (see docs/rules.md). There is no hand-written op list: the detector reads the
matrix knowledge/op_matrix.py builds from the torch_npu wheel (its CPU-fallback warnings and NPU kernel
registrations), for the torch_npu release the knowledge base reads (NPUPORT_KB_TORCH_NPU). Without a stored
matrix the detector reports nothing; the ascend-sim run's op report still names the ops that fell back.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import libcst as cst

from agents.models import Frame, StructuredException
from agents.rules.base import (
    MEDIUM,
    SLOWS,
    ErrorPattern,
    HazardRule,
    Signature,
)
from agents.rules.context import ModuleContext

# torch namespaces whose functions are aten ops under a prefix (torch.linalg.eigh -> aten::linalg_eigh)
_NAMESPACES = {"torch.": "", "torch.linalg.": "linalg_", "torch.special.": "special_", "torch.fft.": "fft_",
               "torch.nn.functional.": ""}


@lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> dict[str, Any] | None:
    from knowledge.op_matrix import load_matrix

    try:
        m = load_matrix(path)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - an unreadable matrix is no matrix
        return None
    # op name (no overload) -> (status, the wheel's message): the call's overload is the default one (the
    # functional form, e.g. aten::sinc falls back although aten::sinc.out has a kernel); an op without a
    # default overload counts when none of its overloads has an NPU kernel.
    by_name: dict[str, list[dict[str, Any]]] = {}
    for key, e in m.ops.items():
        by_name.setdefault(key.split(".")[0], []).append(e)
    status: dict[str, tuple[str, str]] = {}
    for name, entries in by_name.items():
        base = m.ops.get(name)
        if name.startswith("_") or (base.get("npu") if base else any(e.get("npu") for e in entries)):
            continue
        fb = base if base and base.get("fallback") else next((e for e in entries if e.get("fallback")), None)
        if fb is not None:
            status[name] = ("falls back to the CPU", fb.get("fallback_message") or m.fallback_messages.get(name, ""))
        else:
            status[name] = ("has no NPU kernel", "")
    return {"version": m.torch_npu_version, "status": status,
            "source": ", ".join(s["kind"] for s in m.sources) or "matrix"}


def fallback_table() -> dict[str, Any] | None:
    """{"version", "status": {op: (status, the wheel's message)}, "source"} from the stored op matrix of the
    knowledge base's torch_npu release; None when none is stored."""
    from knowledge.op_matrix import matrix_path
    from knowledge.settings import settings

    path = matrix_path(settings().kb_torch_npu)
    if not path.is_file():
        return None
    return _load(str(path), path.stat().st_mtime)


# --- detector ----------------------------------------------------------------------------------

def _h7_fallback_ops(ctx: ModuleContext) -> None:
    table = fallback_table()
    if not table:
        return
    status: dict[str, tuple[str, str]] = table["status"]
    for call in ctx.ix.calls:
        f = call.func
        q = ctx.qual(f)
        op: str | None = None
        for ns, prefix in _NAMESPACES.items():
            rest = q.removeprefix(ns) if q.startswith(ns) else None
            if rest and "." not in rest and prefix + rest in status:
                op = prefix + rest
        if op is None and isinstance(f, cst.Attribute) and not ctx.is_module_ref(f.value) \
                and not q.startswith("torch.") and f.attr.value in status:
            op = f.attr.value  # a Tensor method (x.sinc())
        if op is None:
            continue
        what, msg = status[op]
        said = f" (the wheel says: \"{msg[:160]}\")" if msg else ""
        ctx.add("H7", "cpu-fallback-op", call,
                f"`aten::{op}` {what} on Ascend per the op matrix of torch_npu {table['version']} "
                f"(from the {table['source']}){said}: it runs on the CPU with a device round trip each call, "
                "and fails when TORCH_NPU_FALLBACK_CPU_DISABLE=1", SLOWS, MEDIUM)


_FALLBACK_OP = re.compile(r"The operator '([\w:.]+)' would execute its main computation on CPU")


def _fallback_disabled(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    if (fm := _FALLBACK_OP.search(exc.message)) or "TORCH_NPU_FALLBACK_CPU_DISABLE" in exc.message:
        op = fm.group(1) if fm else "unknown"
        return Signature("npu-fallback-disabled", f"npu-fallback-disabled:{op}@{where}",
                         f"{op} has no NPU kernel and CPU fallback is disabled", frame)
    return None


RULE = HazardRule(
    hazard="H7",
    title="Ops that fall back to the CPU on Ascend",
    detect=_h7_fallback_ops,
    manual={"cpu-fallback-op": "an exact rewrite with supported ops depends on the op and its numerics"},
    explains=(ErrorPattern("npu-fallback-disabled", _fallback_disabled, "ops that fall back to the CPU",
                           needs_frame=False, order=40),),
    kb_topic="recipe:H7",
    left_as_written="falls back to the CPU on this torch_npu build; correct but slow",
    fixtures=("tests/test_cast_world_fallback.py", "examples/ocr_mini"),
)
