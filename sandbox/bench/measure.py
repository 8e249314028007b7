"""The benchmark's numbers from the run's supervisor (sandbox/isolation/supervisor.py), not from the model's process.

The bench process (sandbox/bench/throughput.py) runs the model's code, so its own clock and its result are the model
process's claims. Each wave of requests it runs is a section timed by the supervisor (from its ``go`` to
the bench's ``end``), labelled with the configuration, concurrency, repeat and wave; the parent rebuilds
every point from those sections: throughput = new tokens of the repeat's waves / the supervisor's time of
those waves; latency = the supervisor's time until the request's wave ended. The token counts (and the
first request's tokens, compared with the reference here, not by the bench) stay the model process's
claims, labelled so. A point whose waves the supervisor did not time (a model that wrote its own
numbers) is not measured.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from sandbox.isolation.supervised import Supervised


def section_label(config_id: str, concurrency: int, repeat: int, wave: int, kind: str = "wave") -> str:
    return json.dumps([kind, config_id, concurrency, repeat, wave])


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); exact for the small samples a benchmark has."""
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))  # ceil(q/100 * n), at least 1
    return ordered[min(rank, len(ordered)) - 1]


def _waves(sup: Supervised) -> dict[tuple[str, int], dict[int, list[dict[str, Any]]]]:
    """(config id, concurrency) -> repeat -> its waves in order, each once."""
    out: dict[tuple[str, int], dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    seen: set[str] = set()
    for s in sup.sections():
        label = str(s.get("label", ""))
        try:
            kind, cid, conc, rep, wave = json.loads(label)
        except (ValueError, TypeError):
            continue
        if kind != "wave" or label in seen:
            continue  # a wave timed twice counts once (its first timing)
        seen.add(label)
        claims = s.get("claims") or {}
        out[(str(cid), int(conc))][int(rep)].append(
            {"wave": int(wave), "s": float(s["s"]), "rows": int(claims.get("rows") or 0),
             "new_tokens": int(claims.get("new_tokens") or 0)})
    return out


def _compile_s(sup: Supervised, config_id: str) -> float | None:
    for s in sup.sections():
        try:
            kind, cid, *_ = json.loads(str(s.get("label", "")))
        except (ValueError, TypeError):
            continue
        if kind == "compile" and cid == config_id:
            return float(s["s"])
    return None


def _measured_point(point: dict[str, Any], repeats: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    throughputs: list[float] = []
    latencies: list[float] = []
    new_tokens = 0
    for rep in sorted(repeats):
        waves = sorted(repeats[rep], key=lambda w: w["wave"])
        elapsed, new_tokens = 0.0, 0
        for w in waves:
            elapsed += w["s"]
            latencies.extend([elapsed] * max(w["rows"], 1))
            new_tokens += w["new_tokens"]
        throughputs.append(new_tokens / elapsed if elapsed > 0 else 0.0)
    med = statistics.median(throughputs)
    claimed = {k: point.get(k) for k in ("tokens_per_s", "latency_p50_s", "latency_p99_s")}
    return {**point, "new_tokens": new_tokens, "tokens_per_s": med, "tokens_per_s_runs": throughputs,
            "spread": (max(throughputs) - min(throughputs)) / med if med > 0 else 0.0,
            "latency_p50_s": _percentile(latencies, 50), "latency_p99_s": _percentile(latencies, 99),
            "measured_by": "supervisor", "claimed_by_model_process": claimed}


def measured_bench(result: dict[str, Any], sup: Supervised,
                   reference_tokens: list[list[int]] | None) -> dict[str, Any]:
    """The bench result with every point's numbers from the supervisor's clock and the reference check
    made here; a configuration whose points the supervisor did not time is ``unmeasured``."""
    waves = _waves(sup)
    for c in result.get("configs") or []:
        if not isinstance(c, dict):
            continue
        cid = str(c.get("id", ""))
        if c.get("status") == "ok":
            points: list[dict[str, Any]] = []
            for p in c.get("points") or []:
                reps = waves.get((cid, int(p.get("concurrency") or 0))) if isinstance(p, dict) else None
                if not reps:
                    c["status"] = "unmeasured"
                    c["detail"] = ("the supervisor timed none of this configuration's calls at concurrency "
                                   f"{p.get('concurrency') if isinstance(p, dict) else '?'}: its numbers would be "
                                   "the model process's own")
                    points = []
                    break
                points.append(_measured_point(p, reps))
            c["points"] = points
        if "compile_s" in c:
            c["compile_s_claimed"] = c["compile_s"]
            c["compile_s"] = _compile_s(sup, cid)
        if reference_tokens is not None and c.get("status") in ("ok", "mismatch"):
            match = c.get("tokens") == reference_tokens[:1]
            c["tokens_match"] = match
            if not match:
                c["status"] = "mismatch"
                c["detail"] = (f"first request's tokens {c.get('tokens')} differ from the reference "
                               f"{reference_tokens[:1]}")
                c["points"] = []
        c["claimed_by_model_process"] = ["tokens", "effects", "new_tokens (per wave)", "status before measuring"]
    return result
