"""Measuring the serving engine: one trial starts the bundle's serve.sh with one configuration of the
engine's knobs (agents/tuning/engine.py), checks the server's greedy tokens, runs a short serving load at
the objective's concurrency (repeated on the same server), and stops it.

The objective is output tokens/s at that concurrency; a configuration whose median TTFT or TPOT breaks the
latency SLO is no candidate (status ``slo``), and one whose tokens differ is not measured (``mismatch``): a
fast wrong answer is worth nothing. How the server is started and talked to is the deployment's own
client (sandbox/serving/client.py, in the sandbox), passed in as ``run_client`` so this module stays below
agents/deploy.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import progress
from agents.tuning.engine import EngineFacts, engine_args
from agents.tuning.search import Evaluate, Outcome

RunClient = Callable[[dict[str, Any], Path], dict[str, Any]]  # (serve_client spec, run dir) -> its result
TokenCheck = Callable[[list[list[int]]], tuple[bool, str]]  # served tokens -> (ok, verdict)
TRIAL_REPEATS = 2  # the load is run this many times on the same server (a start is the expensive part)


@dataclass
class Slo:
    """The latency objective a configuration must meet (medians over the load's requests, as the client
    received the stream). None: no bound."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def violation(self, ttft_ms: float | None, tpot_ms: float | None) -> str | None:
        if self.ttft_ms is not None and ttft_ms is not None and ttft_ms > self.ttft_ms:
            return f"median TTFT {ttft_ms:g} ms exceeds the SLO of {self.ttft_ms:g} ms"
        if self.tpot_ms is not None and tpot_ms is not None and tpot_ms > self.tpot_ms:
            return f"median TPOT {tpot_ms:g} ms exceeds the SLO of {self.tpot_ms:g} ms"
        return None

    def describe(self) -> str:
        parts = [f"TTFT <= {self.ttft_ms:g} ms" if self.ttft_ms is not None else "",
                 f"TPOT <= {self.tpot_ms:g} ms" if self.tpot_ms is not None else ""]
        return " and ".join(p for p in parts if p) or "none"


@dataclass
class EngineBench:
    """Runs trials of one servable model under one serve.sh."""

    run_client: RunClient
    facts: EngineFacts
    base_spec: dict[str, Any]  # serve_sh, servable_dir, serve_dir, model_name, prompts, max_new_tokens, requests
    base_args: list[str]  # host arguments every trial needs (--skip-tokenizer-init, --model-impl ...)
    runs_dir: Path
    concurrency: int
    check: TokenCheck | None = None
    slo: Slo = field(default_factory=Slo)
    repeats: int = TRIAL_REPEATS
    n: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)

    def spec(self, point: dict[str, Any], concurrencies: list[int], run_dir: Path) -> dict[str, Any]:
        args, env = engine_args(point, self.facts)
        return {**self.base_spec, "extra_args": [*self.base_args, *args], "env": env,
                "concurrencies": concurrencies, "log_path": str(run_dir / "server.log")}

    def measure(self, point: dict[str, Any], tag: str, concurrencies: list[int] | None = None) -> dict[str, Any]:
        """One server start with ``point``; the client's result (tokens, one bench row per load)."""
        run_dir = self.runs_dir / tag
        run_dir.mkdir(parents=True, exist_ok=True)
        conc = concurrencies or [self.concurrency] * self.repeats
        return self.run_client(self.spec(point, conc, run_dir), run_dir)

    def outcome(self, res: dict[str, Any]) -> Outcome:
        if not res.get("started"):
            return Outcome(None, "error", "the server did not start: " + str(res.get("error") or "")[-600:])
        if not res.get("ok"):
            return Outcome(None, "error", str(res.get("error") or "the client failed")[-600:])
        served = [t.get("tokens") or [] for t in res.get("tokens") or []]
        verdict = ""
        if self.check is not None and served:
            ok, verdict = self.check(served)
            if not ok:
                return Outcome(None, "mismatch", f"tokens through the server: {verdict}")
        rows = [r for r in res.get("bench") or [] if r.get("output_tokens_per_s")]
        if not rows:
            return Outcome(None, "error", "the load produced no tokens")
        runs = [float(r["output_tokens_per_s"]) for r in rows]
        med = statistics.median(runs)
        ttft = statistics.median(float(r["median_ttft_ms"]) for r in rows)
        tpot = statistics.median(float(r["median_tpot_ms"]) for r in rows)
        extras = {"runs": runs, "median_ttft_ms": ttft, "median_tpot_ms": tpot, "start_s": res.get("start_s"),
                  "tokens": verdict}
        why = self.slo.violation(ttft, tpot)
        if why:
            return Outcome(None, "slo", f"{why} ({med:.0f} tok/s)", extras={**extras, "tokens_per_s": med})
        return Outcome(med, "ok", spread=(max(runs) - min(runs)) / med if med else 0.0, extras=extras)

    def evaluator(self, budget: int | None = None) -> Evaluate:
        def evaluate(params: dict[str, Any]) -> Outcome:
            self.n += 1
            of = f"{self.n}/{budget}" if budget else str(self.n)
            conf = " ".join(f"{k}={v}" for k, v in params.items())
            progress.emit("phase", text=f"engine trial {of}: serve.sh with {conf}")
            res = self.measure(params, f"engine-trial-{self.n}")
            out = self.outcome(res)
            what = f"{out.value:.0f} tok/s" if out.value is not None else f"{out.status}: {out.detail[:80]}"
            progress.emit("phase", text=f"engine trial {of}: {what}")
            self.log.append({"trial": self.n, "params": dict(params), "status": out.status, "value": out.value,
                             "detail": out.detail, **{k: v for k, v in out.extras.items() if k != "tokens"}})
            return out

        return evaluate
