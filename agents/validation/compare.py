"""Validation: the original's reference run and the comparison of its greedy tokens and tensors with the port's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.models import Numerics, RunRecord
from agents.runs import record_of, run_spec
from agents.state import diagnoses_of, patches_of, workdir_of
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


def outputs_file(run: RunRecord) -> Path:
    """Where the runner asked the harness to save a forward's outputs (never the path result.json names:
    sandboxed code can write result.json)."""
    return Path(run.result_path).parent / "outputs.pt"


def compared_outputs(port: RunRecord, ref: RunRecord) -> bool:
    """Validate on forward outputs: the runs returned named tensors, not token ids (an encoder)."""
    return bool(port.output_tensors or ref.output_tensors) and port.tokens is None and ref.tokens is None


def _shape(meta: Any) -> str:
    return "(" + ", ".join(str(d) for d in (meta or {}).get("shape") or []) + ")"


def compare_outputs(port: RunRecord, ref: RunRecord, dtype: str = "float32") -> Numerics:
    """A model without generate (an encoder) is validated on what its forward returns: every named floating
    output of the original (hidden states, pooled output, logits, embeddings) against the port's, each
    within the tolerance of the port's dtype (agents/validation/numerics.py): cosine similarity and the share of
    elements off by more than 1e-3 relative."""
    import torch

    from agents.validation.numerics import MAX_CAPTURE_BYTES, TOLERANCES, tensor_metrics, within
    from sandbox.isolation.rundir import check_zip_bounded

    tol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    rule = (f"the {dtype} tolerance: cosine >= {tol.min_cosine}, at most {tol.max_share_over_1e3:.0%} of elements off "
            "by more than 1e-3 relative")
    try:
        loaded = []
        for run in (port, ref):
            check_zip_bounded(outputs_file(run), MAX_CAPTURE_BYTES, MAX_CAPTURE_BYTES)  # hostile data: bounded first
            loaded.append(torch.load(outputs_file(run), weights_only=True))
        got, want = loaded
    except Exception as exc:  # a run that saved no outputs: nothing to compare
        return Numerics(verdict="not-run", compared="outputs",
                        detail=f"no forward outputs to compare ({type(exc).__name__}: "
                                                                      f"{str(exc)[:120]})")
    if not isinstance(got, dict) or not isinstance(want, dict) or not want:
        return Numerics(verdict="not-run", compared="outputs", detail="no forward outputs to compare")
    per: dict[str, dict[str, float]] = {}
    parts, bad = [], []
    for name, expected in want.items():
        actual = got.get(name)
        if not isinstance(actual, torch.Tensor) or not isinstance(expected, torch.Tensor):
            bad.append(f"{name} (the port returned none)")
            continue
        m = tensor_metrics(actual, expected)
        per[name] = m
        meta = (ref.output_tensors or {}).get(name)
        if m.get("shape_mismatch"):
            bad.append(f"{name} (shape {tuple(actual.shape)}, the original's {tuple(expected.shape)})")
            continue
        parts.append(f"{name} {_shape(meta)}: cosine {m['cosine']:.6f}, max abs err {m['max_abs']:.2e}, "
                     f"{m['share_over_1e3']:.1%} of elements off by > 1e-3")
        if not within(m, tol):
            bad.append(name)
    metrics = {"outputs": per, "dtype": dtype,
               "tolerance": {"min_cosine": tol.min_cosine, "max_share_over_1e3": tol.max_share_over_1e3}}
    if bad:
        detail = f"forward outputs differ from the original's beyond {rule}: {', '.join(bad)}; " + "; ".join(parts)
        return Numerics(verdict="mismatch", compared="outputs", metrics=metrics, detail=detail)
    detail = f"forward outputs (no generate: an encoder) equal the original's within {rule}: " + "; ".join(parts)
    return Numerics(verdict="match", compared="outputs", metrics=metrics, detail=detail)


def reference_run(state: dict[str, Any], name: str = "reference") -> tuple[RunRecord, int]:
    """The original as written, under the device redirect, on the CPU in float32; and how many sandbox runs
    that took. An original that cannot be built on a host without CUDA (a constructor's kernel assert, a
    hard-wired kernel flag) is run again with the port's switch-only fix applied to the reference copy, and
    the record says so (``reference_adjusted``, agents/validation/reference.py)."""
    from agents.validation.reference import (
        adjust_reference,
        adjustments,
        environment_replay,
        failure_text,
        reference_dir,
    )

    ws = Workspace(workdir_of(state))
    spec = run_spec(state, target=reference_target()).as_reference(reference_dir(ws))
    notes = adjustments(ws)
    rec = record_of(spec.harness(ws.runs_dir / name), name, "reference", "cpu (cuda->cpu redirect)")
    runs = 1
    replay = environment_replay(patches_of(state), diagnoses_of(state))
    # A run stopped at its time limit says nothing about CUDA: no switch-only fix is called for
    if not rec.ok and rec.status != "timeout" and not notes and \
            (notes := adjust_reference(ws, failure_text(rec.exception), replay)):
        rec = record_of(spec.harness(ws.runs_dir / f"{name}-adjusted"), name, "reference", "cpu (cuda->cpu redirect)")
        runs += 1
    return rec.model_copy(update={"reference_adjusted": notes or None}), runs


def timeout_detail(what: str, limit_s: float, runs: Sequence[RunRecord]) -> str:
    """A run stopped at its wall limit, said as such: the limit, how long the port's own runs took (``runs``: the
    port's so far), and the flag that raises it (never a porting failure, never a CUDA build failure)."""
    port = [r.wall_s for r in runs if r.purpose == "port" and r.ok]
    took = f"; the port's own run took {max(port):.0f} s" if port else ""
    return (f"{what} was stopped at its time limit of {limit_s:.0f} s on this host{took}: a timeout, not a porting "
            f"failure; `--run-timeout {int(max(limit_s * 2, 600))}` raises the limit")


def self_disagreement(first: RunRecord, second: RunRecord) -> Numerics | None:
    """The verdict when two runs of the unpatched original (same seed, same weights seeding, fresh
    processes) disagree: the port cannot be judged against a reference that differs from itself, and a
    "first diverging module" between port and reference would blame the port for it. None when they agree
    (or the second could not run: the first run's comparison stands)."""
    if second.ok and compared_outputs(first, second):
        again = compare_outputs(second, first)
        if again.verdict != "mismatch":
            return None
        return Numerics(verdict="nondeterministic-reference", compared="outputs", metrics=again.metrics,
                        detail="the original is not deterministic: two runs of the unpatched original on the CPU (same "
                               f"seed, same seeded weights) gave different forward outputs ({again.detail}), so the "
                               "port's outputs cannot be checked against it; look for randomness the seed does not "
                               "reach (uninitialised buffers, dropout left on, time or hash-dependent code)")
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
    if out and numerics.compared == "tokens":  # a forward's outputs were compared one by one already
        detail += f"; step output cosine {out['cosine']:.6f}, max abs err {out['max_abs']:.2e}"
    first = cmp["first_diverging_module"] if verdict == "mismatch" else None
    if first:
        detail += f"; first diverging module: {first}"
    return numerics.model_copy(update={"verdict": verdict, "detail": detail, "metrics": {**numerics.metrics, **cmp},
                                       "first_diverging_module": first})
