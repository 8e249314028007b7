"""One port of a batch, as run by a Ray task or a local worker process: the ordinary single-port
graph (graph.jobs_support.run_thread) with its own workspace, sandbox and bundle. The task records
its own result in the batch store, so a driver that dies loses nothing the task finished.

``python -m graph.batch.port JOB.json`` runs one job (the local executor)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agents.models import Diagnosis, Finding, Patch
from agents.request import PortRequest, request_of
from agents.state import (
    bundle_of,
    counters_of,
    diagnoses_of,
    findings_of,
    numerics_of,
    patches_of,
    reason_of,
    started_at_of,
    status_of,
    target_name_of,
    tuning_of,
)
from graph.batch.manifest import PortSpec
from graph.batch.sources import stage
from graph.batch.store import BatchStore
from knowledge.bundles import is_npuport_bundle
from knowledge.errors import SourceError, error_record
from knowledge.settings import set_environment


def _limit_threads(n: int) -> None:
    # the sandbox passes OMP_NUM_THREADS / MKL_NUM_THREADS on to the port's runs (sandbox/isolation/process.py)
    set_environment({var: str(n) for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})


def summarize(state: dict[str, Any], spec: PortSpec, wall_s: float, note: str) -> dict[str, Any]:
    """The batch's row for a finished port, from its final state and report.json."""
    bundle = bundle_of(state).dir
    report: dict[str, Any] = {}
    if bundle and (Path(bundle) / "report.json").is_file():
        try:
            report = json.loads((Path(bundle) / "report.json").read_text())
        except (OSError, json.JSONDecodeError):
            report = {}
    counters = counters_of(state)
    findings = findings_of(state)
    patches = patches_of(state)
    resolutions = report.get("resolutions") or {}
    fixed = sum(1 for v in resolutions.values() if str(v).startswith("fixed"))
    if not resolutions:
        fixed = len({fid for p in patches for fid in p.finding_ids})
    tuned = tuning_of(state).tuned
    records: list[Finding | Diagnosis | Patch] = [*findings, *diagnoses_of(state), *patches]
    cited = sorted({c.source for item in records for c in item.citations})
    status = status_of(state) if status_of(state) in ("validated", "failed") else "failed"
    numerics = numerics_of(state)
    return {
        "model": spec.key, "source": spec.source,
        "target": target_name_of(state) or spec.settings.target,
        "verdict": status, "validation": numerics.verdict if numerics else "not-run",
        "sandbox_runs": counters.port_runs + counters.reference_runs,
        "port_runs": counters.port_runs, "reference_runs": counters.reference_runs,
        "time_s": round(wall_s, 2), "hazards_found": len(findings), "hazards_fixed": fixed,
        "speedup": tuned.get("speedup"), "bundle": bundle,
        "reason": "" if status == "validated" else reason_of(state) or "unknown reason",
        "model_path": request_of(state).model_path,
        "memory_cited": [c for c in cited if c.startswith("memory:")], "note": note,
        "llm_calls": int((report.get("llm") or {}).get("exchanges") or 0),
    }


def execute_port(job: dict[str, Any], stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Run one claimed port to its end and record the result; returns what it recorded
    (``{"skipped": ...}`` when the claim was no longer current). ``stop``: the port runs in a thread of the
    service's worker pool (graph/batch/executors.py PoolExecutor); it ends its graph and kills its sandbox run in
    flight when ``stop()`` turns true, and the process's environment (home, threads) is the service's."""
    from graph.jobs_support import run_thread, thread_snapshot

    spec = PortSpec.model_validate(job["spec"])
    if stop is None:  # a process of its own (local worker, Ray task): the home and threads are this port's
        set_environment({"NPUPORT_HOME": job["home"]})
        _limit_threads(spec.settings.threads)
    store = BatchStore(Path(job["home"]) / "batches.sqlite")
    try:
        if not store.begin(job["attempt_id"], os.getpid()):
            return {"skipped": "the claim is no longer current"}
        store.add_event(job["batch_id"], "port", {"model": spec.key, "status": "running", "resumed": job["resumed"]})
        t0 = time.time()
        try:
            model, note = stage(Path(spec.source), spec.kind, spec.settings.shrink,
                                Path(job["batch_dir"]) / "staging" / spec.key)
        except SourceError as exc:
            return _record(store, job, spec, "failed", str(exc), {"model": spec.key, "source": spec.source,
                           "target": spec.settings.target, "verdict": "failed", "reason": str(exc), "time_s": 0.0})
        s = spec.settings
        bundle = Path(job["bundle_dir"])
        if not job["resumed"] and is_npuport_bundle(bundle):
            # a retry's fresh port replaces the failed attempt's bundle (the reporter never overwrites
            # another port's bundle by itself; the batch owns this folder)
            shutil.rmtree(bundle)
        # a PortRequest, validated like the CLI's and the service's, from every request field of the settings:
        # `shrink` is the request's, so the port's runs derive the small config (sandbox/harness/shrink.py)
        request = PortRequest(model_path=str(model), out_dir=job["bundle_dir"], **s.request_values()).model_dump()
        thread = job["thread_id"]
        snap = thread_snapshot(thread) if job["resumed"] else None
        steps_seen = len(snap.trace) if snap else 0

        def on_trace(trace: list[dict[str, Any]]) -> None:
            nonlocal steps_seen
            for item in trace[steps_seen:]:
                store.add_event(job["batch_id"], "step", {"model": spec.key, "agent": item.get("agent"),
                                                          "summary": item.get("summary", "")})
            steps_seen = max(steps_seen, len(trace))

        if snap is not None and not snap.next:
            values = snap.values  # the graph ended before the task died; only the result was missing
        else:
            inputs = None if snap is not None else {"goal": "", "request": request}
            from knowledge.port_memory import memory_owner

            batch = store.batch(job["batch_id"])
            with memory_owner(batch.owner if batch is not None else ""), _stopped_by(stop):  # learned: its owner's
                values = run_thread(inputs, thread, on_trace=on_trace, should_stop=stop).values
            if stop is not None and stop():
                values = {**values, "status": "failed", "reason": "cancelled (the batch was cancelled)"}
        prior = float((started_at_of(snap.values) if snap else None) or t0)
        row = summarize(values, spec, time.time() - min(prior, t0), note)
        return _record(store, job, spec, row["verdict"], row["reason"], row)
    except Exception as exc:  # a bug or a broken host: this port fails with the reason, the batch goes on
        rec = error_record(exc)
        reason = f"{'internal error: ' if rec['kind'] == 'internal' else ''}{rec['error']}: {rec['message']}"
        return _record(store, job, spec, "failed", reason, {"model": spec.key, "source": spec.source,
                       "target": spec.settings.target, "verdict": "failed", "reason": reason, "error": rec,
                       "traceback": traceback.format_exc(limit=5)})
    finally:
        store.close()


@contextlib.contextmanager
def _stopped_by(stop: Callable[[], bool] | None) -> Iterator[None]:
    """In the service's pool: a cancel kills the sandbox run in flight (the pool confines it like a job)."""
    if stop is None:
        yield
        return
    from sandbox.isolation.process import stop_runs_when

    with stop_runs_when(stop):
        yield


def _record(store: BatchStore, job: dict[str, Any], spec: PortSpec, status: str, reason: str,
            row: dict[str, Any]) -> dict[str, Any]:
    if store.complete(job["attempt_id"], status, reason, row):
        store.add_event(job["batch_id"], "port", {"model": spec.key, "status": status, "reason": reason})
    return row


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    execute_port(job)


if __name__ == "__main__":
    main()
