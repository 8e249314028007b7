"""Numerics: msProbe-style comparison of captured tensors (port vs the original's semantics).

Per tensor: cosine similarity, max absolute error, max relative error, and the share of elements
whose relative error exceeds one thousandth. Relative error is |a - b| / |b| where |b| is above a
floor (1e-6 times the tensor's largest magnitude), so elements that are zero in both count as exact.
torch is imported inside the functions: graph and api import this module without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    min_cosine: float
    max_share_over_1e3: float


# Per dtype of the port's computation, against the float32 reference. float32 ports of float32/float64
# originals differ only by rounding. A half-precision port rounds every op's result (float16's unit
# roundoff is 4.9e-4, bfloat16's 3.9e-3), so after a few layers a large share of elements differs from
# float32 by more than 1e-3 as a matter of course (a float16 GPT measured 18-30 %); there the cosine is the
# guard, and the share only catches wholesale divergence.
TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(min_cosine=0.99999, max_share_over_1e3=0.01),
    "float16": Tolerance(min_cosine=0.999, max_share_over_1e3=0.5),
    "bfloat16": Tolerance(min_cosine=0.99, max_share_over_1e3=0.9),
}


def tensor_metrics(port: Any, ref: Any) -> dict[str, float]:
    import torch

    a = port.double().flatten()
    b = ref.double().flatten()
    if a.shape != b.shape:
        return {"shape_mismatch": 1.0, "cosine": 0.0, "max_abs": float("inf"), "max_rel": float("inf"),
                "share_over_1e3": 1.0}
    diff = (a - b).abs()
    floor = max(float(b.abs().max()) * 1e-6, 1e-12) if b.numel() else 1e-12
    denom = b.abs()
    significant = denom > floor
    rel = torch.where(significant, diff / denom.clamp_min(floor),
                      torch.where(diff > floor, torch.ones_like(diff), torch.zeros_like(diff)))
    na, nb = a.norm(), b.norm()
    cosine = float((a @ b) / (na * nb)) if float(na) > 0 and float(nb) > 0 else float(torch.equal(a, b))
    return {
        "cosine": cosine,
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "max_rel": float(rel.max()) if rel.numel() else 0.0,
        "share_over_1e3": float((rel > 1e-3).double().mean()) if rel.numel() else 0.0,
    }


def within(m: dict[str, float], tol: Tolerance) -> bool:
    return (not m.get("shape_mismatch") and m["cosine"] >= tol.min_cosine
            and m["share_over_1e3"] <= tol.max_share_over_1e3)


MAX_CAPTURE_BYTES = 1 << 30  # a capture file, on disk and inflated


def compare_captures(port_path: Path, ref_path: Path, order: list[str], dtype: str = "float32") -> dict[str, Any]:
    """Metrics for every tensor both runs captured, the step output's verdict, and the first module
    (in the port's execution order) that leaves the tolerance."""
    import torch

    from sandbox.isolation.rundir import check_zip_bounded

    # Capture files come from the run folders (hostile data): a regular file, bounded, and bounded once
    # inflated, before torch reads a byte of it.
    for path in (port_path, ref_path):
        check_zip_bounded(path, MAX_CAPTURE_BYTES, MAX_CAPTURE_BYTES)
    port = torch.load(port_path, weights_only=True)
    ref = torch.load(ref_path, weights_only=True)
    tol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    per: dict[str, dict[str, float]] = {}
    first_bad: str | None = None
    for name in order:
        if name in ref and name in port:
            m = tensor_metrics(port[name], ref[name])
            per[name] = m
            if first_bad is None and name != "__step__" and not within(m, tol):
                first_bad = name
    output = per.get("__step__")
    return {
        "dtype": dtype,
        "tolerance": {"min_cosine": tol.min_cosine, "max_share_over_1e3": tol.max_share_over_1e3},
        "output": output,
        "output_within_tolerance": bool(output is None or within(output, tol)),
        "first_diverging_module": first_bad,
        "modules_compared": len(per),
        "per_module": per,
    }
