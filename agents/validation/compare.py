"""Validation: the original's reference run and the comparison of its greedy tokens and tensors with the port's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.models import Numerics, RunRecord
from agents.runs import record_of, run_spec
from agents.workspace import Workspace
from sandbox.targets import reference_target


def token_agreement(ref: list[list[int]], port: list[list[int]]) -> float:
    total = sum(len(r) for r in ref)
    if total == 0 or len(ref) != len(port):
        return 0.0
    same = sum(a == b for r, p in zip(ref, port, strict=True) for a, b in zip(r, p, strict=False))
    return same / total


def compare_tokens(ref: list[list[int]] | None, port: list[list[int]] | None) -> Numerics:
    if ref is None or port is None:
        return Numerics(verdict="not-run", detail="no tokens to compare")
    agreement = token_agreement(ref, port)
    same = ref == port
    detail = "greedy tokens identical" if same else f"greedy tokens differ: {agreement:.0%} agree"
    return Numerics(verdict="match" if same else "mismatch", token_agreement=agreement,
                    reference_tokens=ref, port_tokens=port, detail=detail)


def reference_run(state: dict[str, Any], name: str = "reference") -> RunRecord:
    """The original as written, under the device redirect, on the CPU in float32."""
    ws = Workspace(Path(state["workdir"]))
    original = ws.root / "original"
    ws.original_tree(original)
    run = run_spec(state, target=reference_target()).as_reference(original).harness(ws.runs_dir / name)
    return record_of(run, name, "reference", "cpu (cuda->cpu redirect)")


def self_disagreement(first: RunRecord, second: RunRecord) -> Numerics | None:
    """The verdict when two runs of the unpatched original (same seed, same weights seeding, fresh
    processes) disagree: the port cannot be judged against a reference that differs from itself, and a
    "first diverging module" between port and reference would blame the port for it. None when they agree
    (or the second could not run: the first run's comparison stands)."""
    if not second.ok or second.tokens is None or first.tokens == second.tokens:
        return None
    agree = token_agreement(first.tokens or [], second.tokens)
    return Numerics(verdict="nondeterministic-reference", token_agreement=agree, reference_tokens=first.tokens,
                    detail=f"the original is not deterministic: two runs of the unpatched original on the CPU "
                           f"(same seed, same seeded weights) gave different greedy tokens ({agree:.0%} agree), so "
                           "the port's tokens cannot be checked against it; look for randomness the seed does not "
                           "reach (uninitialised buffers, sampling in forward, time or hash-dependent code)")


def with_metrics(numerics: Numerics, port: RunRecord, ref: RunRecord, dtype: str) -> Numerics:
    """Add msProbe-style metrics of the captured tensors; a token match whose step output leaves the
    dtype's tolerance is still a mismatch, and any mismatch names the first diverging module."""
    from agents.validation.numerics import compare_captures

    port_res = json.loads(Path(port.result_path).read_text())
    # The capture files sit where the runner asked the harness to write them, not where result.json says:
    # sandboxed code can write result.json.
    p_path, r_path = Path(port.result_path).parent / "capture.pt", Path(ref.result_path).parent / "capture.pt"
    if not p_path.exists() or not r_path.exists():
        return numerics
    order = [n for n in (port_res.get("outputs") or {}).get("captured") or [] if isinstance(n, str)]
    try:
        cmp = compare_captures(p_path, r_path, order, dtype)
    except Exception as exc:  # unreadable captures: keep the token verdict, say why metrics are missing
        return numerics.model_copy(update={"detail": f"{numerics.detail}; no tensor metrics ({type(exc).__name__})"})
    per = cmp.pop("per_module")
    cmp["worst_modules"] = dict(sorted(per.items(), key=lambda kv: kv[1]["cosine"])[:5])
    verdict = numerics.verdict
    detail = numerics.detail
    if verdict == "match" and not cmp["output_within_tolerance"]:
        verdict, detail = "mismatch", f"{detail}, but the step output leaves the {dtype} tolerance"
    out = cmp.get("output") or {}
    if out:
        detail += f"; step output cosine {out['cosine']:.6f}, max abs err {out['max_abs']:.2e}"
    first = cmp["first_diverging_module"] if verdict == "mismatch" else None
    if first:
        detail += f"; first diverging module: {first}"
    return numerics.model_copy(update={"verdict": verdict, "detail": detail, "metrics": cmp,
                                       "first_diverging_module": first})
