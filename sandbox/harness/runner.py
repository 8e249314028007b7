"""Parent side of a sandbox run: writes the harness spec, runs the harness in the sandbox, reads the
result back. Everything the run produced stays in its run directory.

The run sees (under bwrap) the model's tree read-only and its own run folder read-write; the rest of
the workspace (npuport's git, the original, other runs such as the reference) is masked. The harness runs
the model in a worker process under a trusted supervisor (sandbox/isolation/supervisor.py), which alone holds the
result pipe the parent opened (its fd number in HARNESS_RESULT_FD): the model's code can neither write it
nor forge the clock. The supervisor's timings replace the worker's, its findings refuse the run, and the
rest is labelled as the model process's claims (sandbox/isolation/supervised.py). A run that ends without a result
failed, whatever its exit code. The parent then writes ``result.json`` itself, scrubbed of the server's
secrets and capped in size, through sandbox/isolation/rundir.py (the run folder is hostile data: no name in it is
followed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knowledge.settings import settings
from sandbox.harness.spec import HarnessSpec, HarnessTarget
from sandbox.isolation.process import (
    ExecResult,
    Limits,
    Mounts,
    Sandbox,
    default_sandbox,
    scrub,
    scrubbed_env,
)
from sandbox.isolation.rundir import discard, workspace_problem, write_own
from sandbox.isolation.supervised import Supervised, decode, label_claims, supervised_argv
from sandbox.targets import Target

MAX_RESULT_BYTES = 8 * 1024 * 1024
MAX_RESULT_TOKENS = 262_144
MAX_MESSAGE_CHARS = 4_000
MAX_TRACEBACK_CHARS = 20_000


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


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "exception": {"type": kind, "message": message, "frames": []}}


def _clean(result: dict[str, Any]) -> dict[str, Any]:
    """Cap and scrub the text a run hands back; refuse outputs larger than any real check needs."""
    exc = result.get("exception")
    if isinstance(exc, dict):
        exc["message"] = scrub(str(exc.get("message", "")))[:MAX_MESSAGE_CHARS]
        if "traceback" in exc:
            exc["traceback"] = scrub(str(exc["traceback"]))[-MAX_TRACEBACK_CHARS:]
        for fr in exc.get("frames") or []:
            if isinstance(fr, dict):
                fr["code"] = scrub(str(fr.get("code", "")))[:500]
    if isinstance(result.get("warnings"), list):
        result["warnings"] = [scrub(str(w))[:1000] for w in result["warnings"][:200]]
    outputs = result.get("outputs") or {}
    tokens = outputs.get("tokens") if isinstance(outputs, dict) else None
    if isinstance(tokens, list):
        n = sum(len(r) if isinstance(r, list) else 1 for r in tokens)
        if n > MAX_RESULT_TOKENS:
            return _failure("ResultTooLarge", f"the run returned {n} tokens; the cap is {MAX_RESULT_TOKENS}")
    if isinstance(outputs, dict) and isinstance(outputs.get("text"), list):
        outputs["text"] = [scrub(str(t))[:MAX_MESSAGE_CHARS] for t in outputs["text"]]
    return result


def _option_roots() -> list[Path]:
    """npuport's own folders a target option may name (the op matrices, the native engine's builds): an option
    path anywhere else (one a report wrote) is never bound into a run."""
    from knowledge.home import cache_dir
    from sandbox.ascend_sim.native_build import cache_root

    return [cache_dir("matrices").resolve(), cache_root().resolve()]


def option_paths(options: dict[str, Any] | None) -> list[Path]:
    """The host paths a target's options name that a run may see (the emulator's op matrix and native engine):
    only those inside npuport's own caches."""
    from knowledge.untrusted import is_inside

    roots = _option_roots()
    return [Path(v).resolve() for v in (options or {}).values()
            if isinstance(v, str) and v.startswith("/") and Path(v).exists()
            and any(is_inside(r, Path(v)) for r in roots)]


def _mounts(workdir: Path, model_dir: Path, run_dir: Path, target: Target, python: str | None = None) -> Mounts:
    ro = [model_dir.resolve(), *option_paths(target.options)]
    return Mounts(hide=(workdir.resolve(),), ro=tuple(ro), rw=(run_dir.resolve(),),
                  interpreters=(python,) if python else ())


def _supervised_result(sup: Supervised) -> dict[str, Any]:
    """The run's result from the supervisor's message: the worker's claims with the supervisor's clock, or
    the reason it is refused ({} when nothing came back)."""
    if sup.unreadable == "too-large":
        return _failure("ResultTooLarge", f"the run's result is larger than {MAX_RESULT_BYTES // 2**20} MiB; "
                                          "npuport refuses it")
    if sup.unreadable:
        return _failure("HarnessResultUnreadable", sup.unreadable)
    if sup.refused:
        return _failure("UntrustedResult", f"the supervisor refused the model process's result: {sup.refused}")
    if sup.claims is None:
        return {}
    result = dict(sup.claims)
    m = sup.measured
    result["timings_claimed"] = result.get("timings")
    result["timings"] = {"load_s": m.get("load_s"), "run_s": [s["s"] for s in sup.sections("run")],
                         "warmup_s": [s["s"] for s in sup.sections("warmup")], "total_s": m.get("total_s"),
                         "measured_by": "supervisor"}
    return result


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
    interpreter of a layered environment holding the model's own pins (agents/environment/resolve.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = run_dir / "result.json"
    harness_target = None if reference else target.harness_target()
    spec = HarnessSpec(
        model_dir=str(model_dir.resolve()),
        manifest=manifest,
        device="cuda" if reference else target.device,
        redirect="cuda->cpu" if reference else (f"cuda->{target.device.split(':')[0]}" if redirect_cuda else None),
        target=HarnessTarget(**harness_target) if harness_target else None,
        result_channel=True,  # the result comes back on a pipe; its fd number is in HARNESS_RESULT_FD
        capture_path=str((run_dir / "capture.pt").resolve()),
        outputs_path=str((run_dir / "outputs.pt").resolve()),  # a forward's outputs (an encoder's validation)
        # NPUPORT_PROFILE=0 turns the decode profile off (bench/profile_overhead.py's baseline).
        profile=settings().profile,
    ).replace(**(extra or {}))
    spec_path = run_dir / "spec.json"
    write_own(spec_path, spec.to_json())  # a link left by an earlier run in this folder is not followed
    discard(result_path)  # a stale result never stands for this run's
    env = scrubbed_env({} if reference else target.env)
    argv = supervised_argv(python, "sandbox.harness.worker", spec_path, MAX_RESULT_BYTES)
    box = sandbox or default_sandbox()
    lim = limits or Limits()
    if full := workspace_problem(workdir, lim.workspace_quota_mb):  # the sum of every run folder of the port
        result = _failure("WorkspaceQuota", full)
        write_own(result_path, json.dumps(result, indent=1))
        return HarnessRun(run_dir=run_dir, result=result, exec_result=ExecResult(
            returncode=None, status="killed", wall_s=0.0, stdout="", stderr="", isolation=box.name, notes=[full]))
    exec_result = box.execute(argv, cwd=run_dir.resolve(), env=env, limits=lim,
                              mounts=_mounts(workdir, model_dir, run_dir, target, python),
                              result_channel=True, channel_cap=MAX_RESULT_BYTES + 65536)
    exec_result.stdout, exec_result.stderr = scrub(exec_result.stdout), scrub(exec_result.stderr)
    # The run may have planted links, FIFOs or folders under these names: write_own never follows them.
    write_own(run_dir / "stdout.log", exec_result.stdout)
    write_own(run_dir / "stderr.log", exec_result.stderr)
    sup = decode(exec_result)
    result = _supervised_result(sup)
    if not result:
        if exec_result.status == "timeout":
            result = _failure("Timeout", f"the run exceeded its wall-clock limit of {lim.wall_s:g} s and was killed")
        else:
            tail = "\n".join(exec_result.stderr.strip().splitlines()[-5:])
            result = _failure("ProcessDied", f"the sandboxed process ended (status {exec_result.status}, code "
                                             f"{exec_result.returncode}) without reporting a result: {tail}")
    result = label_claims(_clean(result), sup)
    if exec_result.notes:
        result.setdefault("warnings", [])
        result["warnings"] = [*result["warnings"], *(f"sandbox: {n}" for n in exec_result.notes)]
    write_own(result_path, json.dumps(result, indent=1, default=str))
    return HarnessRun(run_dir=run_dir, exec_result=exec_result, result=result)
