"""The served-token gate of the exercised deployment: the server's greedy tokens against Transformers in
float32 and in the serving dtype (a three-way comparison), and, where the tokens part at a near-tie, the
top-k log-probabilities.

Order of decision (``decided_by`` in the record):
1. **exact tokens**: the server's greedy tokens equal Transformers float32's;
2. **top-k logprobs** (when both sides have them): up to and including each row's first divergence
   (after it the two decode different contexts) the server's top-k logprobs agree with Transformers
   float32's within the tolerance, and every divergence is a near-tie: the served token is in float32's
   top-k and its logprob is within the tolerance of the float32 token's. The tolerance is calibrated to
   the reference's own drift: ``LOGPROB_DRIFT_FACTOR`` x the largest |float32 - serving dtype| logprob
   difference Transformers itself shows on the same positions, never below ``LOGPROB_FLOOR`` nats;
3. **token-match rate** (no logprobs on one side): equality with Transformers in the serving dtype, or a
   served match rate against float32 (tokens up to each row's first divergence) at least Transformers'
   own rate in that dtype.
The record always carries both match rates (served vs float32, Transformers dtype vs float32).
"""

from __future__ import annotations

import math
from typing import Any

LOGPROB_DRIFT_FACTOR = 2.0
LOGPROB_FLOOR = 0.05  # nats: below this, differences are the kernels' rounding, not the model


def prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def match_rate(got: list[list[int]], want: list[list[int]]) -> float:
    """Tokens up to each row's first divergence, over the tokens wanted (after a divergence the two decode
    different contexts, so later positions say nothing)."""
    total = sum(len(w) for w in want)
    return sum(prefix_len(g, w) for g, w in zip(got, want, strict=True)) / total if total else 1.0


def _top(pos: dict[str, Any]) -> dict[str, float]:
    return {str(k): float(v) for k, v in (pos.get("top") or {}).items()}


def reference_drift(fp32: list[list[dict[str, Any]]], low: list[list[dict[str, Any]]]) -> float:
    """The largest |float32 - low-precision| logprob of the same token at the same position (teacher
    forced along the float32 tokens): how far Transformers itself moves in the serving dtype."""
    worst = 0.0
    for row32, rowlow in zip(fp32, low, strict=True):
        for a, b in zip(row32, rowlow, strict=True):
            ta, tb = _top(a), _top(b)
            for t in set(ta) & set(tb):
                worst = max(worst, abs(ta[t] - tb[t]))
    return worst


def logprob_check(served: list[list[int]], served_lps: list[list[dict[str, float]]],
                  ref_fp32: list[list[dict[str, Any]]], ref_low: list[list[dict[str, Any]]],
                  fp32_tokens: list[list[int]]) -> dict[str, Any]:
    """Top-k logprobs of the server against Transformers float32 up to each row's first divergence, and
    whether every divergence is a near-tie, within the drift-calibrated tolerance (module docstring)."""
    drift = reference_drift(ref_fp32, ref_low)
    tol = max(LOGPROB_DRIFT_FACTOR * drift, LOGPROB_FLOOR)
    worst, compared, divergences, problems = 0.0, 0, [], []
    for i, (got, want, lps, ref) in enumerate(zip(served, fp32_tokens, served_lps, ref_fp32, strict=True)):
        d = prefix_len(got, want)
        for n in range(min(d + 1, len(lps), len(ref))):
            mine, theirs = {str(k): float(v) for k, v in lps[n].items()}, _top(ref[n])
            common = set(mine) & set(theirs)
            if not common:
                problems.append(f"prompt {i} position {n}: no token in both top-k lists")
                continue
            for t in common:
                diff = abs(mine[t] - theirs[t])
                compared += 1
                if diff > worst:
                    worst = diff
        if d < min(len(got), len(want)) and d < len(ref):
            theirs = _top(ref[d])
            served_tok, ref_tok = str(got[d]), str(want[d])
            gap = theirs[ref_tok] - theirs[served_tok] if served_tok in theirs and ref_tok in theirs else math.inf
            divergences.append({"prompt": i, "position": d, "served": got[d], "float32": want[d],
                                "float32_logprob_gap": None if math.isinf(gap) else round(gap, 5)})
            if gap > tol:
                problems.append(f"prompt {i} position {d}: served token {got[d]} is "
                                + ("not in float32's top-k" if math.isinf(gap) else
                                   f"{gap:.3f} nats below float32's {want[d]}, beyond the tolerance"))
    if worst > tol:
        problems.append(f"a top-k logprob differs by {worst:.3f} nats, beyond the tolerance")
    return {"ok": not problems and compared > 0, "tolerance": round(tol, 5), "reference_drift": round(drift, 5),
            "max_abs_diff": round(worst, 5), "compared": compared, "divergences": divergences,
            "problems": problems[:8]}


def token_check(served: list[list[int]], refs: dict[str, list[list[int]]], dtype: str,
                served_logprobs: list[list[dict[str, float]]] | None = None,
                ref_logprobs: dict[str, Any] | None = None, logprobs_note: str | None = None) -> dict[str, Any]:
    """The three-way comparison: Transformers float32, Transformers in the serving dtype, the server (in the
    serving dtype), with the top-k logprobs where both sides have them (module docstring)."""
    fp32, low = refs["float32"], refs.get(dtype) or refs["float32"]
    want = [w[:len(s)] if len(s) < len(w) else w for s, w in zip(served, fp32, strict=True)]
    rate_served, rate_ref = match_rate(served, want), match_rate(low, fp32)
    lp = None
    if served_logprobs and ref_logprobs and ref_logprobs.get("float32") and ref_logprobs.get(dtype) \
            and len(served_logprobs) == len(served):
        lp = logprob_check(served, served_logprobs, ref_logprobs["float32"], ref_logprobs[dtype], want)
    rates = (f"token-match rate vs float32 (up to each row's first divergence): served {rate_served:.0%}, "
             f"Transformers {dtype} {rate_ref:.0%}")
    if served == want:
        verdict, ok, decided = "exact: the server's greedy tokens equal Transformers float32", True, "exact tokens"
    elif lp is not None:
        decided, ok = "top-k logprobs", lp["ok"]
        where = ", ".join(f"prompt {d['prompt']} position {d['position']} (gap {d['float32_logprob_gap']})"
                          for d in lp["divergences"][:4])
        verdict = (f"tokens part at near-ties ({where}); top-k logprobs agree with float32 within "
                   f"{lp['tolerance']:.3f} nats (largest difference {lp['max_abs_diff']:.3f})" if ok else
                   f"mismatch by logprobs: {'; '.join(lp['problems'][:3])} (tolerance {lp['tolerance']:.3f} nats)")
    elif served == low:
        verdict, ok, decided = f"equal to Transformers in {dtype}", True, "token-match rate"
    elif rate_served >= rate_ref:
        verdict, ok, decided = f"within the reference's {dtype} drift", True, "token-match rate"
    else:
        verdict, ok, decided = (f"mismatch: the served rate is below Transformers {dtype}'s own", False,
                                "token-match rate")
    if lp is not None:
        mode = (f"greedy tokens and top-{_k(served_logprobs)} logprobs (tolerance {lp['tolerance']:.3f} nats = "
                f"max({LOGPROB_DRIFT_FACTOR:g} x the reference's own float32-vs-{dtype} drift "
                f"{lp['reference_drift']:.3f}, {LOGPROB_FLOOR:g}))")
    else:
        mode = "exact greedy tokens and the drift-calibrated token-match rate" + (
            f" (no logprobs compared: {logprobs_note})" if logprobs_note else " (no logprobs compared)")
    return {"ok": ok, "verdict": f"{verdict}; {rates}", "decided_by": decided, "mode": mode, "logprobs": lp,
            "match_rate_served_vs_fp32": round(rate_served, 4), "match_rate_ref_dtype_vs_fp32": round(rate_ref, 4),
            "served": served, "reference_float32": fp32, f"reference_{dtype}": low}


def _k(rows: list[list[dict[str, float]]] | None) -> int:
    return max((len(pos) for row in rows or [] for pos in row), default=0)
