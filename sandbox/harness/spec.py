"""The harness spec: the one typed object the parent writes into a run folder (``spec.json``) and the worker
reads back, for a harness run (``HarnessSpec``) and for the tuner's benchmark (``BenchSpec``, the same fields
and its points). Unknown keys are refused on both sides, so a field is added here once and nowhere else.

The standard library and knowledge.errors only: the worker reads it under a layered environment's interpreter, where
npuport's own dependencies (pydantic among them) may be other releases or absent."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from knowledge.errors import SpecError

SpecT = TypeVar("SpecT", bound="HarnessSpec")

@dataclass(frozen=True)
class HarnessTarget:
    """The target as the worker needs it: its name, the bootstrap ``module:function`` it calls with
    ``options`` before the model is imported (ascend-sim's emulated runtime, torch_npu on a real NPU)."""

    name: str
    bootstrap: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HarnessSpec:
    """One run of a model in the sandbox (docs/architecture.md, "Harness contract")."""

    model_dir: str
    manifest: dict[str, Any]
    device: str
    redirect: str | None = None
    """``cuda->cpu`` (the reference: the original as written on the CPU), ``cuda->npu`` (unported code on
    the target, as torch_npu's transfer_to_npu does), or None."""
    target: HarnessTarget | None = None
    seed: int = 0
    warmup: int = 0
    repeats: int = 1
    threads: int | None = None
    shrink: bool = False
    """Build the derived small config (sandbox/harness/shrink.py) instead of config.json's."""
    run_config: dict[str, Any] | None = None
    """The config a port ran with (its bundle's run_config.json), built as it is: verify re-runs the port on it
    rather than deriving a small config again."""
    dtype: str | None = None
    run_kwargs: dict[str, Any] = field(default_factory=dict)
    config_overrides: dict[str, Any] = field(default_factory=dict)
    capture: tuple[str, ...] = ()
    """Module names whose outputs are captured (``__step__`` for the decode step, ``*`` for every one)."""
    profile: bool = True
    result_channel: bool = False
    """The result goes to the supervisor over the worker's channel (HARNESS_RESULT_FD), never to a file."""
    result_path: str | None = None
    capture_path: str | None = None
    outputs_path: str | None = None

    @property
    def redirect_to(self) -> str:
        """The device cuda is redirected to (``cpu``, ``npu``), or "" when nothing is redirected."""
        return (self.redirect or "").partition("->")[2]

    def replace(self: SpecT, **changes: Any) -> SpecT:
        """A copy with ``changes``; an unknown field is a SpecError (a typo never becomes a silent no-op)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise SpecError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **_typed(type(self), changes))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, default=str)

    @classmethod
    def from_dict(cls: type[SpecT], data: dict[str, Any]) -> SpecT:
        if not isinstance(data, dict):
            raise SpecError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise SpecError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
        try:
            return cls(**_typed(cls, data))
        except TypeError as exc:  # a required field missing
            raise SpecError(f"{cls.__name__}: {exc}") from None

    @classmethod
    def read(cls: type[SpecT], path: Path | str) -> SpecT:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class BenchSpec(HarnessSpec):
    """The tuner's benchmark (sandbox/bench/throughput.py): each configuration measured at each concurrency."""

    warmup: int = 1
    repeats: int = 3
    configs: tuple[dict[str, Any], ...] = ({"id": "default"},)
    concurrencies: tuple[int, ...] = (1,)
    reference_tokens: list[list[int]] | None = None


def _typed(cls: type[HarnessSpec], data: dict[str, Any]) -> dict[str, Any]:
    """JSON values in the spec's own types: the target as a HarnessTarget, lists kept as tuples."""
    out = dict(data)
    if isinstance(out.get("target"), dict):
        out["target"] = HarnessTarget(**out["target"])
    for name in ("capture", "configs", "concurrencies"):
        if isinstance(out.get(name), list):
            out[name] = tuple(out[name])
    for name in ("run_kwargs", "config_overrides"):
        if name in out and out[name] is None:
            out[name] = {}
    if out.get("configs") == ():  # no configurations: the default one
        out["configs"] = ({"id": "default"},)
    return out
