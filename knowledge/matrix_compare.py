"""The op-support matrix's two sources held against each other (the wheel's NPU kernels and op-plugin's
yaml), and the plain-text summary of ``npuport ops matrix``."""

from __future__ import annotations

from typing import Any, Protocol

# Dispatch keys whose wrappers are NPU kernels of the op (Autograd/Sparse ones are not).
KERNEL_KEYS = ("NPU", "QuantizedNPU")


class MatrixLike(Protocol):
    """What the comparison reads of an OpMatrix (knowledge/op_matrix.py)."""

    ops: dict[str, dict[str, Any]]
    unresolved_wrappers: list[str]

    def summary(self) -> dict[str, Any]: ...


REASONS = {
    # the yaml names the op (some version) and the two sources disagree for this version
    "yaml_other_versions": "the wheel registers it; the yaml lists it only for other torch versions",
    "wheel_other_overload": "yaml lists it but the wheel registers it under a different overload",
    "structured_out": "registered in the wheel via a structured/out kernel: the wheel has the .out "
    "variant, which this variant calls",
    "wheel_other_key": "the wheel registers it only under another dispatch key (Autograd/Sparse)",
    "unresolved_symbol": "the wheel has a kernel symbol for it that does not follow the codegen naming",
    "composite_in_torch": "composite in this torch (CompositeImplicitAutograd): no NPU kernel needed",
    "yaml_only": "yaml lists it for this version but the wheel has no NPU kernel for it",
    # wheel kernels the yaml never names (outside op-plugin's yaml)
    "core_op": "torch_npu core op: registered by torch_npu itself, not by op-plugin",
    "codegen_only": "in the wheel's own codegen yaml (op-plugin at the build's commit), not in this yaml",
    "wheel_only": "the wheel registers an NPU kernel no yaml lists",
}


def compare_wheel_yaml(matrix: MatrixLike) -> dict[str, Any]:
    """Agreement between the wheel's NPU kernels and the yaml's entries for this torch version.

    Compared: the aten ops both sources name, i.e. every op the yaml names (for any torch
    version) that the wheel registers or the yaml lists for this version. Agreement = ops with
    the same verdict (kernel / no kernel) / ops compared; each disagreement gets a reason.
    Wheel kernels the yaml never names (torch_npu's own core ops, ...) are listed apart in
    ``outside_yaml``; ``agreement_all`` counts them as disagreements too.
    """
    ops = matrix.ops
    by_name: dict[str, list[str]] = {}
    for k in ops:
        by_name.setdefault(k.split(".")[0], []).append(k)
    disagreements: list[dict[str, Any]] = []
    outside: list[dict[str, Any]] = []
    compared = agree = 0
    for key, e in ops.items():
        in_wheel = _in_wheel(e)
        in_yaml = e.get("yaml_kernel") is not None
        if not (in_wheel or in_yaml):
            continue
        if not e.get("yaml_named"):
            reason = (
                "core_op"
                if e.get("codegen") == "core"
                else "codegen_only"
                if e.get("codegen")
                else "wheel_only"
            )
            outside.append({"op": key, "side": "wheel_only", "reason": reason})
            continue
        compared += 1
        if in_wheel and in_yaml:
            agree += 1
            continue
        side = "wheel_only" if in_wheel else "yaml_only"
        disagreements.append({"op": key, "side": side, "reason": _reason(key, e, ops, by_name, matrix)})
    by_reason: dict[str, int] = {}
    for d in disagreements + outside:
        by_reason[d["reason"]] = by_reason.get(d["reason"], 0) + 1
    total = compared + len(outside)
    return {
        "compared": compared,
        "agree": agree,
        "agreement": round(agree / compared, 4) if compared else 0.0,
        "agreement_all": round(agree / total, 4) if total else 0.0,
        "by_reason": dict(sorted(by_reason.items())),
        "reasons": REASONS,
        "disagreements": disagreements,
        "outside_yaml": outside,
    }


def _in_wheel(e: dict[str, Any]) -> bool:
    return any(k in KERNEL_KEYS for k in e.get("wheel_keys", []))


def _reason(
    key: str,
    e: dict[str, Any],
    ops: dict[str, dict[str, Any]],
    by_name: dict[str, list[str]],
    matrix: MatrixLike,
) -> str:
    name = key.split(".")[0]
    if _in_wheel(e):
        return "yaml_other_versions"
    if e.get("wheel_keys"):
        return "wheel_other_key"
    out_sib = e.get("decomposes_to")
    if out_sib and _in_wheel(ops.get(out_sib, {})):
        return "structured_out"
    if any(_in_wheel(ops[k]) for k in by_name.get(name, []) if k != key):
        return "wheel_other_overload"
    if any(f"_{name}_" in w for w in matrix.unresolved_wrappers):
        return "unresolved_symbol"
    if e.get("composite") == "implicit":
        return "composite_in_torch"
    return "yaml_only"


def format_summary(matrix: MatrixLike) -> str:
    """A few plain-text lines for ``npuport ops matrix``."""
    s = matrix.summary()
    lines = [
        f"torch_npu {s['torch_npu_version']} (torch {s['torch_version']}): {s['npu_ops']} aten ops run on "
        f"the NPU ({s['own_kernels']} own kernels, "
        + ", ".join(f"{v} {k}" for k, v in s["composite"].items())
        + " composite)",
        "kernels: " + ", ".join(f"{k} {v}" for k, v in s["by_kernel"].items()),
        f"CPU fallbacks named by the wheel: {s['fallback_ops']}; custom ops: {s['custom_ops']}; "
        f"ops with dtype lists: {s['with_dtypes']}",
        "sources: " + "; ".join(f"{k}={v}" for k, v in s["sources"].items()),
    ]
    if "agreement" in s:
        a = s["agreement"]
        lines.append(
            f"wheel vs yaml: {a['agree']}/{a['compared']} agree ({a['agreement']:.1%}); "
            + ", ".join(f"{k} {v}" for k, v in a["by_reason"].items())
        )
    return "\n".join(lines)
