"""How much a deployment check serves, and the time it may take (agents/deploy/serving.py).

A port's check is :data:`PROBE`: the server's start, the token gate and a short throughput probe, within
3 minutes beyond the start on a 2-core host for a shrunk model. :data:`FULL` is the side-by-side throughput
comparison (every concurrency, Transformers batched): ``--bench`` or ``npuport bench BUNDLE``.
"""

from __future__ import annotations

from dataclasses import dataclass

CONCURRENCIES = (1, 8, 32)
TOP_K = 5  # logprobs per position compared through the server
# Transformers one request at a time is timed on the first HF_SINGLE requests of the workload (the slowest
# measurement of the check; a rate needs no more), batched on all of them; vLLM serves all at every concurrency.
HF_SINGLE = 12
# An image request runs the model's vision encoder on the CPU: its workload is the first IMAGE_REQUESTS requests.
IMAGE_REQUESTS = 8


@dataclass(frozen=True)
class CheckPlan:
    """How much one deployment check serves, and the time it may take."""

    name: str
    requests: int  # the workload (mixed lengths)
    hf_single: int | None  # Transformers one at a time on this prefix of it (None: all)
    concurrencies: tuple[int, ...]
    batched: bool  # Transformers batched at each concurrency above 1
    throughput_budget_s: float  # Transformers' throughput measurements, all together
    start_timeout_s: float  # the server must answer /health within this
    after_start_s: float  # the client's run beyond the server's start: tokens and throughput
    reference_s: float  # the Transformers side: build, export, references, throughput
    image_requests: int | None = IMAGE_REQUESTS

    def cut(self) -> str:
        """What this plan leaves out of the full comparison (empty for the full one)."""
        if self.batched:
            return ""
        return (f"a throughput probe only (vLLM at concurrency {', '.join(map(str, self.concurrencies))} on "
                f"{self.requests} requests, Transformers one request at a time on {self.hf_single}); the full "
                f"side-by-side comparison (concurrency {', '.join(map(str, FULL.concurrencies))}, Transformers "
                "batched) runs with `--bench` or `npuport bench BUNDLE`")


# A port's check: <= 3 minutes beyond the server's start on a 2-core host for a shrunk model.
PROBE = CheckPlan("probe", requests=16, hf_single=4, concurrencies=(1, 8), batched=False, throughput_budget_s=30.0,
                  start_timeout_s=900.0, after_start_s=180.0, reference_s=600.0)
FULL = CheckPlan("full", requests=48, hf_single=HF_SINGLE, concurrencies=CONCURRENCIES, batched=True,
                 throughput_budget_s=480.0, start_timeout_s=900.0, after_start_s=900.0, reference_s=1380.0)
