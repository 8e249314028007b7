"""tuner: benchmarks the validated port against the original as written and searches its
configuration (batch size, dtype, attention implementation, torch.compile, threads, KV cache).

Without ``tune`` in the request it records the harness timings of the validation runs. With it:
constraints prune the target's space, npuport's search (agents/tuning/search.py) runs trials in the
sandbox benchmark within the trial and time budgets, then the best configuration and the baseline
(original, eager, batch 1, cuda->cpu redirect) are benchmarked at several concurrencies on the same
host. Every trial lands in ``tuning.trials``.
"""

from __future__ import annotations

from typing import Any

from agents.models import Tuning
from agents.request import request_of
from agents.trace import step
from agents.tuning.port import skeleton_tuning, tune_port


def tuner_node(state: dict[str, Any]) -> dict[str, Any]:
    req = request_of(state)
    asked_llm = False
    if not req.tune:
        tuning = skeleton_tuning(state)
    else:
        from agents.llm.assist import llm_enabled

        asked_llm = llm_enabled(req.policy)  # the LLM proposed trials: the report lists the outcome
        try:
            tuning = tune_port(state)
        except Exception as exc:  # tuning must never lose a validated port
            tuning = Tuning(status="failed", detail=f"tuning stopped: {type(exc).__name__}: {str(exc)[:300]}")
    return {"tuning": tuning.model_dump(mode="json"),
            "trace": [step("tuner", tuning.detail, **({"llm": True} if asked_llm else {}))]}
