"""Sandbox runs: the one ``RunSpec`` every caller of the harness and the bench builds its runs from,
a harness result turned into a RunRecord, and the limits a request sets."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.models import Frame, RunRecord, StructuredException
from agents.request import PortRequest, request_of
from agents.state import entry_of, environment_of, runs_of, target_of, workdir_of
from knowledge.disk import explain_write_failure
from sandbox.bench.runner import BenchRun, run_bench
from sandbox.harness.runner import HarnessRun, run_harness
from sandbox.isolation.process import Limits
from sandbox.targets import Target, reference_target

STEP_CAPTURE = ("__step__", "*")
"""Capture every module's output at each decode step (per-module numerics)."""


@dataclass(frozen=True)
class RunSpec:
    """What a sandbox run of a port is: the model folder, the target, the limits, the interpreter,
    the --shrink config and what to capture. Built once (``RunSpec.of``, ``run_spec(state)``) and
    varied with ``replace``, so the executor, the validator, the tuner's bench, verify and the op
    inventory all run the model under the same conditions."""

    workdir: Path
    model_dir: Path
    manifest: dict[str, Any]
    target: Target
    limits: Limits
    python: str | None = None
    """The layered environment's interpreter (the model's own pins), or None for the host's."""
    shrink: bool = False
    """Run the derived small config (sandbox/harness/shrink.py), port and reference alike."""
    capture: tuple[str, ...] = ()
    reference: bool = False
    """The original as written, under the cuda->cpu redirect, in float32."""
    redirect_cuda: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, *, workdir: Path, model_dir: Path, manifest: Mapping[str, Any], target: Target,
           request: PortRequest | Mapping[str, Any] | None = None, python: str | None = None,
           limits: Limits | None = None) -> RunSpec:
        """The spec of a port's runs: the request gives the limits and the shrink."""
        req = request_of(request)
        return cls(workdir=Path(workdir), model_dir=Path(model_dir), manifest=dict(manifest), target=target,
                   limits=limits or limits_for(req), python=python,
                   shrink=req.shrink)

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def as_reference(self, original: Path) -> RunSpec:
        """The same run of the original on the reference target, capturing every step."""
        return self.replace(model_dir=Path(original), target=reference_target(), reference=True,
                            capture=STEP_CAPTURE)

    def harness(self, run_dir: Path) -> HarnessRun:
        extra = {**self.extra, "shrink": self.shrink, **({"capture": list(self.capture)} if self.capture else {})}
        return run_harness(workdir=self.workdir, model_dir=self.model_dir, run_dir=run_dir, manifest=self.manifest,
                           target=self.target, reference=self.reference, limits=self.limits, extra=extra,
                           redirect_cuda=self.redirect_cuda, python=self.python)

    def bench(self, run_dir: Path, configs: list[dict[str, Any]], **kwargs: Any) -> BenchRun:
        """The benchmark of these runs' model on their target (``kwargs``: concurrencies, repeats, ...)."""
        t = self.target
        return run_bench(workdir=self.workdir, model_dir=self.model_dir, run_dir=run_dir, manifest=self.manifest,
                         configs=configs, device=t.device, target=t.harness_target() if t.bootstrap else None,
                         env=t.env, limits=self.limits, python=self.python, shrink=self.shrink, **kwargs)


def run_spec(state: Mapping[str, Any], target: Target | None = None) -> RunSpec:
    """The spec of a port's runs, from the graph state: the workspace's patched model on the resolved
    target, with limits that scale with the host (:func:`scaled_limits`), the request's shrink and the
    environment node's interpreter."""
    workdir = workdir_of(state)
    req = request_of(state)
    return RunSpec.of(workdir=workdir, model_dir=workdir / "model", manifest=entry_of(state),
                      target=target or target_of(state), request=req, python=environment_of(state).python,
                      limits=scaled_limits(req, runs_of(state)))


RUN_CONFIG_NAME = "run_config.json"
"""The bundle's copy of the config the port ran with (under --shrink): run.py, verify and the deployment read it."""


def run_config_of(state: Mapping[str, Any], bundle: Path | None = None) -> dict[str, Any] | None:
    """The config the port's last successful run built its model from (the harness result's ``shrunk_config``:
    the constructor-fitted small config, with the run's config overrides); None when it ran config.json as
    written. With ``bundle``, its run_config.json first (``npuport deploy`` and verify have the bundle alone).
    The one small config of a port: the bundle, verify and the deployment reuse it, never derive one."""
    recorded = _json_object(bundle / RUN_CONFIG_NAME) if bundle is not None else None
    if recorded is not None:
        return recorded
    for run in reversed(runs_of(state)):
        if run.purpose == "port" and run.ok and run.result_path:
            small = (_json_object(Path(run.result_path)) or {}).get("shrunk_config")
            return small if isinstance(small, dict) else None
    return None


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


SCALE_MEASURED = 3.0
"""A run may take this many times the longest finished run of the same model on this host (plus a minute)."""


def scaled_limits(req: PortRequest | Mapping[str, Any], runs: Sequence[RunRecord]) -> Limits:
    """The wall limit of a port's next run: the request's ``run_timeout_s``, raised to SCALE_MEASURED x the longest
    run of the port or its reference that finished on this host (a loaded host runs the reference as slowly as the
    port: the port at 299.7 s of a 300 s limit left its reference no chance), and the other way round."""
    base = float(request_of(req).run_timeout_s)
    done = [r.wall_s for r in runs if r.ok and r.purpose in ("port", "reference")]
    return Limits(wall_s=max(base, SCALE_MEASURED * max(done) + 60) if done else base)


def _exception(result: dict[str, Any], run_dir: Path) -> StructuredException | None:
    exc = result.get("exception")
    if not exc:
        return None
    message = exc.get("message", "")
    if why := explain_write_failure(message, run_dir):  # torch.save on a full disk says "unexpected pos"
        message = f"{message} [npuport: {why}]"
    hints = exc.get("hints")
    return StructuredException(type=exc.get("type", "Exception"), message=message,
                               frames=[Frame(**f) for f in exc.get("frames") or []],
                               hints=hints if isinstance(hints, dict) else {})


def record_of(run: HarnessRun, run_id: str, purpose: str, target: str) -> RunRecord:
    res = run.result
    outputs = res.get("outputs") or {}
    status = run.status
    return RunRecord(
        id=run_id, purpose=purpose, target=target, ok=run.ok,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        wall_s=round(run.exec_result.wall_s, 3), result_path=str(run.run_dir / "result.json"),
        outputs_digest=outputs.get("digest", ""), tokens=outputs.get("tokens"), timings=res.get("timings") or {},
        exception=_exception(res, run.run_dir), warnings=res.get("warnings") or [], op_stats=res.get("op_stats") or {},
        isolation=run.exec_result.isolation, shrunk=res.get("shrunk"), inputs=res.get("inputs"),
        output_tensors=outputs.get("tensors") if isinstance(outputs.get("tensors"), dict) else None,
        built_offline=[str(n) for n in res["built_offline"]] if isinstance(res.get("built_offline"), list) else None,
        coverage=res["coverage"] if isinstance(res.get("coverage"), dict) else None,
    )


def limits_for(req: PortRequest | Mapping[str, Any]) -> Limits:
    return Limits(wall_s=float(request_of(req).run_timeout_s))


def token_summary(tokens: list[list[int]] | None, edge: int = 6) -> str:
    """Token rows for a person to read: a long row (a prompt of image tokens) keeps its first and last
    ``edge`` ids and says how many it leaves out; report.json keeps them all."""
    if tokens is None:
        return "None"
    rows = []
    for row in tokens:
        if len(row) <= 3 * edge:
            rows.append(str(list(row)))
        else:
            head, tail = ", ".join(map(str, row[:edge])), ", ".join(map(str, row[-edge:]))
            rows.append(f"[{head}, ... {len(row) - 2 * edge} more ..., {tail}] ({len(row)} ids)")
    return "[" + ", ".join(rows) + "]"

