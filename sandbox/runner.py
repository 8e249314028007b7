"""Parent side of a sandbox run: writes the harness spec, runs the harness in the sandbox, reads the
result back. Everything the run produced stays in its run directory."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.process import ExecResult, Limits, Sandbox, default_sandbox, scrubbed_env
from sandbox.targets import Target


@dataclass
class HarnessRun:
    run_dir: Path
    exec_result: ExecResult
    result: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.exec_result.status == "ok" and bool(self.result.get("ok"))

    @property
    def status(self) -> str:
        if self.exec_result.status == "timeout":
            return "timeout"
        if self.ok:
            return "ok"
        if not self.result.get("exception") and self.exec_result.status in ("killed", "error"):
            return "crashed"
        return "error"


def run_harness(
    *,
    workdir: Path,
    model_dir: Path,
    run_dir: Path,
    manifest: dict[str, Any],
    target: Target,
    reference: bool = False,
    limits: Limits | None = None,
    sandbox: Sandbox | None = None,
    extra: dict[str, Any] | None = None,
    redirect_cuda: bool = False,
    python: str | None = None,
) -> HarnessRun:
    """Run the harness once. ``reference`` runs the original on the CPU under the cuda -> cpu
    redirect; ``redirect_cuda`` runs unported code on the target with cuda redirected to its device
    (what torch_npu's transfer_to_npu does), for an op inventory before porting. ``python`` is the
    interpreter of a layered environment holding the model's own pins (agents/env_resolve.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / "result.json"
    spec: dict[str, Any] = {
        "model_dir": str(model_dir.resolve()),
        "manifest": manifest,
        "device": "cuda" if reference else target.device,
        "redirect": "cuda->cpu" if reference else (f"cuda->{target.device.split(':')[0]}" if redirect_cuda else None),
        "target": None if reference else target.harness_target(),
        "seed": 0,
        "warmup": 0,
        "repeats": 1,
        "result_path": str(result_path.resolve()),
        "capture_path": str((run_dir / "capture.pt").resolve()),
        # NPUPORT_PROFILE=0 turns the decode profile off (bench/profile_overhead.py's baseline).
        "profile": os.environ.get("NPUPORT_PROFILE", "1") != "0",
    }
    spec.update(extra or {})
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    env = scrubbed_env({} if reference else target.env)
    argv = [python or sys.executable, "-I", "-B", "-u", "-m", "sandbox.harness", str(spec_path.resolve())]
    box = sandbox or default_sandbox()
    exec_result = box.execute(argv, cwd=workdir, env=env, limits=limits or Limits())
    (run_dir / "stdout.log").write_text(exec_result.stdout)
    (run_dir / "stderr.log").write_text(exec_result.stderr)
    result: dict[str, Any] = {}
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
        except json.JSONDecodeError as exc:
            result = {"ok": False, "exception": {"type": "HarnessResultUnreadable", "message": str(exc), "frames": []}}
    if not result:
        if exec_result.status == "timeout":
            message = f"the run exceeded its wall-clock limit of {(limits or Limits()).wall_s:g} s and was killed"
            result = {"ok": False, "exception": {"type": "Timeout", "message": message, "frames": []}}
        else:
            tail = "\n".join(exec_result.stderr.strip().splitlines()[-5:])
            message = f"the sandboxed process ended (status {exec_result.status}, code {exec_result.returncode}) without a result: {tail}"
            result = {"ok": False, "exception": {"type": "ProcessDied", "message": message, "frames": []}}
    return HarnessRun(run_dir=run_dir, exec_result=exec_result, result=result)
