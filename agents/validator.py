"""validator: compares the port's greedy tokens on the target with the original's semantics on the
CPU in float32 (the original run under the cuda -> cpu device redirect)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.executor import limits_for, record_of
from agents.models import Numerics, RunRecord
from agents.perf_evidence import analyse, profile_of, verdict
from agents.trace import step
from agents.workspace import Workspace
from sandbox.runner import run_harness
from sandbox.targets import Target


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


def reference_run(state: dict[str, Any]) -> RunRecord:
    """The original as written, under the device redirect, on the CPU in float32."""
    ws = Workspace(Path(state["workdir"]))
    original = ws.root / "original"
    ws.original_tree(original)
    run = run_harness(workdir=ws.root, model_dir=original, run_dir=ws.runs_dir / "reference",
                      manifest=state["entry"], target=Target("cpu", "cpu"), reference=True, extra=CAPTURE,
                      limits=limits_for(state["request"]),
                      python=(state.get("environment") or {}).get("python"))
    return record_of(run, "reference", "reference", "cpu (cuda->cpu redirect)")


CAPTURE = {"capture": ["__step__", "*"]}


def _with_metrics(numerics: Numerics, port: RunRecord, ref: RunRecord, dtype: str) -> Numerics:
    """Add msProbe-style metrics of the captured tensors; a token match whose step output leaves the
    dtype's tolerance is still a mismatch, and any mismatch names the first diverging module."""
    from agents.numerics import compare_captures

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


def validator_node(state: dict[str, Any]) -> dict[str, Any]:
    runs = state.get("runs") or []
    port = RunRecord(**runs[-1])
    ref_dict = next((r for r in runs if r["purpose"] == "reference"), None)
    new_runs: list[dict[str, Any]] = []
    counters = dict(state.get("counters") or {})
    if ref_dict is None:
        ref = reference_run(state)
        new_runs.append(ref.model_dump(mode="json"))
        counters["reference_runs"] = counters.get("reference_runs", 0) + 1
    else:
        ref = RunRecord(**ref_dict)
    if not ref.ok:
        exc = ref.exception
        detail = f"the original could not run under the device redirect: {exc.type}: {exc.message[:200]}" if exc else "reference failed"
        numerics = Numerics(verdict="not-run", detail=detail)
    else:
        numerics = compare_tokens(ref.tokens, port.tokens)
        numerics = _with_metrics(numerics, port, ref, "float32")
    # Decode profiles of the same two runs (sandbox/profile.py) -> performance pathologies.
    perf = analyse(profile_of(port.result_path), profile_of(ref.result_path) if ref.ok else None)
    perf_note = f"; {verdict('validated', perf)}" if numerics.verdict == "match" else ""
    return {"numerics": numerics.model_dump(mode="json"), "runs": new_runs, "counters": counters, "perf": perf,
            "trace": [step("validator", f"{numerics.verdict}: {numerics.detail} (reference {ref.tokens}, "
                                        f"port {port.tokens}){perf_note}")]}
