"""Parent side of a supervised run (sandbox/isolation/supervisor.py): the command line that starts the supervisor
with the model's worker under it, and the reading of what the supervisor sent back.

The result channel carries ``{"supervisor": measured, "claims": the worker's result}``. The parent keeps
the two apart: the supervisor's clock replaces the worker's timings (kept as ``timings_claimed``), its
findings (a foreign process on the worker's channel, a worker replaced by exec, another process that ran
torch, a broken protocol) refuse the run, and the result says which of its fields are the model
process's own claims (``provenance``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.isolation.process import ExecResult
from sandbox.isolation.worker_channel import BOOT

NPUPORT_ROOT = Path(__file__).resolve().parents[2]
SUPERVISOR_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from sandbox.isolation.supervisor import main; "
                   "sys.exit(main(sys.argv[2:]))")
FATAL = ("foreign-reporter", "replaced", "torch-process", "protocol", "too-large", "supervisor-error")
MEASURED = ("timings", "supervisor")


def supervised_argv(python: str | None, module: str, spec_path: Path, max_bytes: int) -> list[str]:
    """npuport's own interpreter runs the supervisor; ``python`` (a layered env's, or ours) runs the
    worker, started with ``-S`` so that it greets the supervisor before any ``.pth`` of its env runs."""
    worker = [python or sys.executable, "-I", "-S", "-B", "-u", "-c", BOOT, str(NPUPORT_ROOT), module,
              str(spec_path.resolve())]
    conf = {"worker": worker, "max_bytes": max_bytes, "watch": True}
    # -S: the supervisor needs the standard library and sandbox/ only; no site set-up (a third of a start)
    return [sys.executable, "-I", "-S", "-B", "-u", "-c", SUPERVISOR_BOOT, str(NPUPORT_ROOT), json.dumps(conf)]


@dataclass
class Supervised:
    """What came back: the worker's claims (None when it sent none), the supervisor's measures, and why
    the run is refused ("" when it is not)."""

    claims: dict[str, Any] | None
    measured: dict[str, Any] = field(default_factory=dict)
    refused: str = ""
    unreadable: str = ""

    def sections(self, label_prefix: str = "") -> list[dict[str, Any]]:
        return [s for s in self.measured.get("sections") or [] if str(s.get("label", "")).startswith(label_prefix)]

    def note(self) -> dict[str, Any]:
        """The supervisor's block kept in the run's result (findings, processes, the worker's exit)."""
        return {k: self.measured.get(k) for k in ("findings", "processes", "worker_exit", "load_s", "total_s")}


def decode(exec_result: ExecResult) -> Supervised:
    """Read the supervisor's message; align the exec result's status with the worker's exit (a worker
    killed by a signal reads as killed, as when it ran directly)."""
    if exec_result.channel_overflow:
        return Supervised(None, unreadable="too-large")
    if not exec_result.channel:
        return Supervised(None)
    try:
        msg = json.loads(exec_result.channel)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        return Supervised(None, unreadable=f"the supervisor's message held no valid JSON: {exc}")
    if not isinstance(msg, dict) or not isinstance(msg.get("supervisor"), dict):
        return Supervised(None, unreadable="the supervisor's message is not an object")
    measured = msg["supervisor"]
    claims = msg.get("claims") if isinstance(msg.get("claims"), dict) else None
    rc = measured.get("worker_exit")
    if isinstance(rc, int) and exec_result.status == "ok" and rc != 0:
        exec_result.returncode = rc
        exec_result.status = "killed" if rc < 0 else "error"
    fatal = [f for f in measured.get("findings") or [] if isinstance(f, dict) and f.get("kind") in FATAL]
    refused = "; ".join(f"{f['kind']}: {f.get('detail', '')}" for f in fatal)
    return Supervised(claims, measured, refused=refused)


def label_claims(result: dict[str, Any], sup: Supervised) -> dict[str, Any]:
    """Say which fields the supervisor measured and which are the model process's claims."""
    result["supervisor"] = sup.note()
    result["provenance"] = {
        "measured_by_supervisor": sorted(k for k in MEASURED if k in result),
        "claimed_by_model_process": sorted(k for k in result if k not in (*MEASURED, "provenance")),
    }
    return result
