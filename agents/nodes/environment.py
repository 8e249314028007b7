"""environment: resolves the target (and, for a target that uses one, the op-support matrix of the
chosen torch_npu build) once per port, and says which and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.request import request_of
from agents.target_state import matrix_for, target_to_dict
from agents.trace import step
from knowledge.errors import TargetError, first_line
from sandbox.targets import Target, get_target_spec, resolve_target


def environment_node(state: dict[str, Any]) -> dict[str, Any]:
    req = request_of(state)
    notes: list[str] = []
    try:
        target = resolve_target(req.target, chip=req.chip, torch_npu=req.torch_npu, strict=req.strict)
    except TargetError as exc:
        return {"status": "failed", "reason": str(exc), "trace": [step("environment", str(exc))]}
    if get_target_spec(target.name).uses_matrix:
        path, note = matrix_for(req.torch_npu)
        notes.append(note)
        why = target.reason  # for auto: why this target was chosen
        target = resolve_target(target.name, chip=req.chip, torch_npu=req.torch_npu, strict=req.strict,
                                matrix_path=path)
        target = Target(target.name, target.device, target.bootstrap, target.options, target.env,
                        reason=f"{why}; {note}")
    summary = f"target {target.name} on device {target.device}" + (f" ({target.reason})" if target.reason else "")
    trace = [step("environment", summary, notes=notes)]
    environment: dict[str, Any] = {"notes": notes}
    try:
        from agents.env_resolve import ensure_env, native_for, resolve
        from knowledge.errors import EnvBuildError

        resolution = resolve(Path(req.model_path), target.name, req.torch_npu)
        environment["resolution"] = resolution.as_dict()
        python = ensure_env(resolution)
        environment["resolution"] = resolution.as_dict()  # with the torch pair chosen while building
        environment["python"] = str(python) if python else None
        if python and target.options.get("native_lib"):
            target = native_for(target, str(python))
        trace.append(step("environment", resolution.summary(), conflicts=resolution.conflicts))
    except EnvBuildError as exc:
        reason = f"cannot build the model's environment: {first_line(exc)}"
        return {"status": "failed", "reason": reason, "target": target_to_dict(target), "environment": environment,
                "trace": [*trace, step("environment", reason)]}
    return {"target": target_to_dict(target), "environment": environment, "trace": trace}

