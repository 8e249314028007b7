"""environment: resolves the target once per port (after fetching, for a target that uses one, the
op-support matrix of the chosen torch_npu build), and says which and why. Every later node reads it
back with agents/state.py ``target_of``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from agents.request import request_of
from agents.state import target_dict
from agents.target_state import matrix_for
from agents.trace import step
from knowledge.errors import TargetError, first_line
from sandbox.targets import get_target_spec, resolve_target


def environment_node(state: dict[str, Any]) -> dict[str, Any]:
    req = request_of(state)
    notes: list[str] = []
    path, matrix_note = None, ""
    try:
        if get_target_spec(req.target).uses_matrix:  # a chooser (auto) that may choose the emulator asks it too
            path, matrix_note = matrix_for(req.torch_npu)
        target = resolve_target(req.target, chip=req.chip, torch_npu=req.torch_npu, strict=req.strict,
                                matrix_path=path)
    except TargetError as exc:
        return {"status": "failed", "reason": str(exc), "trace": [step("environment", str(exc))]}
    if matrix_note and get_target_spec(target.name).uses_matrix:
        notes.append(matrix_note)
        target = dataclasses.replace(target, reason=f"{target.reason}; {matrix_note}")
    summary = f"target {target.name} on device {target.device}" + (f" ({target.reason})" if target.reason else "")
    trace = [step("environment", summary, notes=notes)]
    environment: dict[str, Any] = {"notes": notes}
    try:
        from agents.environment.layered import ensure_env, native_for
        from agents.environment.resolve import resolve
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
        return {"status": "failed", "reason": reason, "target": target_dict(target), "environment": environment,
                "trace": [*trace, step("environment", reason)]}
    return {"target": target_dict(target), "environment": environment, "trace": trace}

