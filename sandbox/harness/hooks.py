"""What a run hooks into the model before calling it: per-step brackets for the target's op counters, the
captured module outputs the validator compares, and the decode profile."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


def bracket_steps(model: Any, step_method: str | None, bootstrap: ModuleType) -> None:
    """Per-step counters: bracket each call of the manifest's step method (one decode step), or each
    top-level forward when the manifest names none."""
    counter = {"n": 0}

    def begin() -> None:
        counter["n"] += 1
        bootstrap.begin_step(f"step-{counter['n']}")

    if step_method:
        inner = getattr(model, step_method)

        def stepped(*args: Any, **kwargs: Any) -> Any:
            begin()
            try:
                return inner(*args, **kwargs)
            finally:
                bootstrap.end_step()

        setattr(model, step_method, stepped)  # instance attribute: the class stays as written
        return
    model.register_forward_pre_hook(lambda _m, _a: begin())
    model.register_forward_hook(lambda _m, _a, _o: bootstrap.end_step())


MAX_CAPTURE_MODULES = 256
MAX_CAPTURE_BYTES = 256 * 1024 * 1024


def capture_hooks(model: Any, names: list[str], captured: dict[str, Any], step_method: str | None) -> list[Any]:
    """Record the first output of named modules, in execution order, on the CPU in float32.
    "__step__" is the manifest's step method (or the model's forward); "*" is every submodule (capped)."""
    import torch

    budget = {"bytes": 0}

    def keep(name: str, out: Any) -> None:
        t = out[0] if isinstance(out, tuple | list) else out
        if name in captured or not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return
        size = t.numel() * 4
        if budget["bytes"] + size > MAX_CAPTURE_BYTES:
            return
        budget["bytes"] += size
        # A device-side copy: moving it to the host here would count as a host sync of the model.
        captured[name] = t.detach().clone()

    handles = []
    wanted = list(names)
    if "*" in wanted:
        wanted.remove("*")
        wanted += [n for n, _ in list(model.named_modules())[1:MAX_CAPTURE_MODULES]]
    for name in wanted:
        if name == "__step__":
            continue
        sub = model.get_submodule(name)
        handles.append(sub.register_forward_hook(lambda _m, _a, out, _n=name: keep(_n, out)))
    if "__step__" in names:
        if step_method:
            inner = getattr(model, step_method)

            def captured_step(*args: Any, **kwargs: Any) -> Any:
                out = inner(*args, **kwargs)
                keep("__step__", out)
                return out

            setattr(model, step_method, captured_step)
        else:
            handles.append(model.register_forward_hook(lambda _m, _a, out: keep("__step__", out)))
    return handles


def profiler_for(on: bool, model: Any, model_dir: Path, bootstrap: ModuleType | None, step: str | None,
                 device: str) -> Any:
    """The decode profile of the run (sandbox/harness/profile.py), unless the spec turns it off."""
    if not on:
        return None
    from sandbox.harness.profile import DecodeProfiler

    return DecodeProfiler(model, str(model_dir), bootstrap, step, device)
