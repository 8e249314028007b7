"""The serving engine's efficiency: what share of a chip's peak compute and memory bandwidth vLLM reaches, and
what each decode step costs beyond the arithmetic (host and launch work per layer, graph mode or eager; per
sequence; per tensor-parallel all-reduce), and the memory the runtime keeps beside weights and KV cache.

None of these is a chip figure: they are fitted (``fit``) to published vllm-ascend throughput and latency
figures (agents/data/published_serving.yaml) by least squares on the log of projected over published, each
source weighted equally, with a weak pull towards the priors below so that a parameter no figure exercises
(eager mode, when every figure ran graph mode: its per-layer time is graph mode's times a factor of at least
1, whose prior is 3) stays where the priors put it. bench/projection.py checks the
fit leave-one-out: a figure is projected with the efficiency fitted on the others only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field

PRIORS: dict[str, float] = {
    "compute": 0.5,          # share of the cube units' peak in the engine's matmuls
    "bandwidth": 0.6,        # share of HBM bandwidth when streaming weights and KV cache
    "layer_ms_graph": 0.15,  # host/launch time per layer per step, ACL graph captured
    "eager_factor": 3.0,     # eager's per-layer time over graph mode's (ops dispatched one by one from the host)
    "seq_ms": 0.1,           # per running sequence per step (scheduling, sampling, detokenising)
    "allreduce_ms": 0.03,    # latency of one tensor-parallel all-reduce (two per layer)
}
PRIOR_WEIGHT = 0.15
"""How hard the fit pulls a parameter towards its prior, per unit of log deviation (against 1 per figure)."""
FITTED = tuple(PRIORS)


class Efficiency(BaseModel):
    compute: float = PRIORS["compute"]
    bandwidth: float = PRIORS["bandwidth"]
    layer_ms_graph: float = PRIORS["layer_ms_graph"]
    eager_factor: float = PRIORS["eager_factor"]
    """At least 1: eager never launches faster than a captured graph."""
    seq_ms: float = PRIORS["seq_ms"]
    allreduce_ms: float = PRIORS["allreduce_ms"]
    reserve_gib: float = 6.0
    """Device memory the runtime holds beside weights and KV cache (activations, graph buffers, HCCL)."""
    fitted_on: list[str] = Field(default_factory=list)
    """The figures the fit saw (ids in agents/data/published_serving.yaml)."""
    note: str = "priors (no published figure fitted)"

    @property
    def layer_ms_eager(self) -> float:
        return self.layer_ms_graph * self.eager_factor

    def layer_ms(self, graph_mode: bool) -> float:
        return self.layer_ms_graph if graph_mode else self.layer_ms_eager

    def vector(self) -> list[float]:
        return [math.log(getattr(self, k)) for k in FITTED]

    def with_vector(self, v: Sequence[float], **extra: Any) -> Efficiency:
        values = {k: math.exp(x) for k, x in zip(FITTED, v, strict=True)}
        values["compute"], values["bandwidth"] = min(values["compute"], 1.0), min(values["bandwidth"], 1.0)
        return self.model_copy(update={**values, **extra})


Residual = Callable[[Efficiency], float]
"""A figure's log(projected / published) under an efficiency."""


def fit(residuals: Sequence[tuple[str, str, Residual]], base: Efficiency | None = None) -> Efficiency:
    """The efficiency that best projects the figures: ``residuals`` are (figure id, source, residual); each
    source carries equal weight whatever its number of figures."""
    from scipy.optimize import least_squares

    start = base or Efficiency()
    if not residuals:
        return start
    per_source: dict[str, int] = {}
    for _, source, _ in residuals:
        per_source[source] = per_source.get(source, 0) + 1
    weights = [1.0 / math.sqrt(per_source[source]) for _, source, _ in residuals]
    priors = [math.log(PRIORS[k]) for k in FITTED]

    def cost(v: Sequence[float]) -> list[float]:
        eff = start.with_vector(v)
        out = [w * r(eff) for w, (_, _, r) in zip(weights, residuals, strict=True)]
        return out + [PRIOR_WEIGHT * (x - p) for x, p in zip(v, priors, strict=True)]

    upper = [0.0 if k in ("compute", "bandwidth") else math.log(100.0) for k in FITTED]
    lower = [math.log(1e-3) if k in ("compute", "bandwidth") else 0.0 if k == "eager_factor" else math.log(1e-4)
             for k in FITTED]
    x0 = [min(max(x, lo + 1e-6), hi - 1e-6) for x, lo, hi in zip(start.vector(), lower, upper, strict=True)]
    result = least_squares(cost, x0, bounds=(lower, upper), loss="soft_l1", f_scale=0.3)
    ids = [fid for fid, _, _ in residuals]
    return start.with_vector(result.x, fitted_on=ids,
                             note=f"fitted on {len(ids)} published figure(s) from {len(per_source)} source(s)")
