"""validator: compares the port's greedy tokens on the target with the original's semantics on the
CPU in float32 (the original run under the cuda -> cpu device redirect)."""

from __future__ import annotations

from typing import Any

from agents.models import Numerics
from agents.request import request_of
from agents.runs import scaled_limits, token_summary
from agents.sites import port_site
from agents.state import counters_of, runs_of, workdir_if_set
from agents.trace import step
from agents.validation.compare import (
    compare_outputs,
    compare_tokens,
    compared_outputs,
    reference_run,
    self_disagreement,
    timeout_detail,
    with_metrics,
)
from agents.validation.coverage import merged_coverage
from agents.validation.perf_evidence import analyse, profile_of, verdict


def validator_node(state: dict[str, Any]) -> dict[str, Any]:
    runs = runs_of(state)
    port = runs[-1]
    found = next((r for r in runs if r.purpose == "reference"), None)
    new_runs: list[dict[str, Any]] = []
    counters = counters_of(state)
    if found is None:
        ref, made = reference_run(state)
        new_runs.append(ref.model_dump(mode="json"))
        counters.reference_runs += made
    else:
        ref = found
    if not ref.ok and ref.status == "timeout":
        limit = scaled_limits(request_of(state), runs).wall_s  # the limit the reference ran under (the runs before it)
        numerics = Numerics(verdict="not-run", detail=timeout_detail(
            "the reference run (the original, on the CPU in float32)", limit, runs))
    elif not ref.ok:
        exc = ref.exception
        # npuport's own note (a full disk: agents/runs.py) is kept past the cut
        said, _, note = exc.message.partition(" [npuport: ") if exc else ("", "", "")
        detail = (f"the original could not run under the device redirect: {exc.type}: {said[:200]}"
                  + (f" [npuport: {note}" if note else "")) if exc else "reference failed"
        numerics = Numerics(verdict="not-run", detail=detail)
    else:
        from agents.rules.h12_half_precision import port_compute_dtype

        # a port that keeps float16 (the chip's cast policy) is held to float16's tolerance
        dtype = port_compute_dtype(state)
        # a model without generate (an encoder) is validated on its forward outputs, within that tolerance
        numerics = compare_outputs(port, ref, dtype) if compared_outputs(port, ref) else compare_tokens(ref.tokens,
                                                                                                           port.tokens)
        numerics = with_metrics(numerics, port, ref, dtype)
        if numerics.verdict == "mismatch" and not any(r.id == "reference-2" for r in runs):
            # Before the port is blamed: does the original agree with itself? (once per port)
            again, made = reference_run(state, "reference-2")
            new_runs.append(again.model_dump(mode="json"))
            counters.reference_runs += made
            numerics = self_disagreement(ref, again) or numerics
    # Which module kinds the two runs exercised: a kind neither ran makes a match "validated (partial: ...)"
    numerics = numerics.model_copy(update={"coverage": merged_coverage(port, ref if ref.ok else None)})
    # Decode profiles of the same two runs (sandbox/harness/profile.py) -> performance pathologies.
    perf = analyse(profile_of(port.result_path), profile_of(ref.result_path) if ref.ok else None)
    for p in perf["pathologies"]:  # the profiled tree is the workspace's now: map its lines to the user's
        p["user_where"] = port_site(p.get("where"), workdir_if_set(state), request_of(state).model_path)
    perf_note = f"; {verdict('validated', perf, numerics.coverage)}" if numerics.verdict == "match" else ""
    return {"numerics": numerics.model_dump(mode="json"), "runs": new_runs, "counters": counters.model_dump(),
            "perf": perf,
            "trace": [step("validator", f"{numerics.verdict}: {numerics.detail}" + _tokens_read(numerics, ref, port)
                           + perf_note)]}


def _tokens_read(numerics: Numerics, ref: Any, port: Any) -> str:
    """The two runs' tokens for the trace line, a long row shortened as the executor's line shortens it."""
    if numerics.compared != "tokens":
        return ""
    return f" (reference {token_summary(ref.tokens)}, port {token_summary(port.tokens)})"
