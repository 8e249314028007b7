"""The batch manifest (YAML): defaults at the top, then the models; or a folder of model folders.

```yaml
name: zoo
defaults:
  target: cpu            # a target of sandbox/targets/registry.py (cpu, ascend-sim, npu, auto)
  chip: 910b
  objective: throughput
  shrink: false          # true: the small config of `npuport port --shrink`; a dict: also these config overrides
  tune: false
  budget: {max_runs: 8, max_wall_s: 1800, run_timeout_s: 300}
  timeout_s: 3600        # the batch kills a port that runs longer
  num_cpus: 1            # declared to Ray, so its scheduler packs ports
  memory_mb: 2048
  threads: 1             # compute threads of the port's runs (OMP_NUM_THREADS)
models:
  - path: ./models/ocr          # a folder (npuport.yaml, or an HF remote-code folder with auto_map)
  - path: ./zoo/llm.tar.gz      # .zip, .tar, .tar.gz, .tgz archives are unpacked under the batch
    name: llm
    target: ascend-sim
```
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents.request import (
    MAX_RUN_TIMEOUT_S,
    MAX_WALL_S,
    POLICIES,
    ChipName,
    PolicyName,
    TargetName,
    TorchNpuVersion,
)
from knowledge.errors import BatchManifestError, first_line
from sandbox.targets import DEFAULT_CHIP, DEFAULT_TARGET, DEFAULT_TORCH_NPU

MAX_MEMORY_MB = 1024 * 1024  # a port's memory request (1 TiB): a ceiling, not a default

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
KEY_PATTERN = r"^\w[\w.-]{0,63}$"
"""A port's key and a batch's name: they name folders under the batch's own (staging, bundles, job files)."""


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_runs: int = Field(default=8, ge=1, le=100)
    max_wall_s: float = Field(default=1800.0, gt=0, le=MAX_WALL_S)
    run_timeout_s: float = Field(default=300.0, gt=0, le=MAX_RUN_TIMEOUT_S)


class PortSettings(BaseModel):
    """Settings of one port; every field may be left out of a model entry to take the batch default."""

    model_config = ConfigDict(extra="forbid")
    # the names and defaults of agents/request.py's PortRequest (the target, chip and policy registries)
    target: TargetName = DEFAULT_TARGET
    chip: ChipName = DEFAULT_CHIP
    objective: Literal["throughput", "latency", "correctness"] = "throughput"
    torch_npu: TorchNpuVersion = DEFAULT_TORCH_NPU
    policy: PolicyName = POLICIES[0]
    strict: bool = False
    shrink: bool | dict[str, Any] = False
    strict_perf: bool = False
    tune: bool = False
    tune_trials: int | None = Field(default=None, ge=1, le=200)
    budget: Budget = Field(default_factory=Budget)
    timeout_s: float = Field(default=3600.0, gt=0, le=MAX_WALL_S)
    num_cpus: float = Field(default=1.0, gt=0, le=256)
    memory_mb: int = Field(default=2048, ge=64, le=MAX_MEMORY_MB)
    threads: int = Field(default=1, ge=1, le=256)


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    # a folder name of npuport's (staging, bundle, job files): never "." or "..", never a path
    name: str | None = Field(default=None, pattern=KEY_PATTERN)
    target: TargetName | None = None
    chip: ChipName | None = None
    objective: Literal["throughput", "latency", "correctness"] | None = None
    torch_npu: TorchNpuVersion | None = None
    policy: PolicyName | None = None
    strict: bool | None = None
    shrink: bool | dict[str, Any] | None = None
    strict_perf: bool | None = None
    tune: bool | None = None
    tune_trials: int | None = Field(default=None, ge=1, le=200)
    budget: dict[str, Any] | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_WALL_S)
    num_cpus: float | None = Field(default=None, gt=0, le=256)
    memory_mb: int | None = Field(default=None, ge=64, le=MAX_MEMORY_MB)
    threads: int | None = Field(default=None, ge=1, le=256)


class BatchManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="batch", pattern=KEY_PATTERN)
    defaults: PortSettings = Field(default_factory=PortSettings)
    models: list[ModelEntry] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _unique_names(self) -> BatchManifest:
        seen: dict[str, str] = {}
        for m in self.models:
            key = m.name or model_key(m.path)
            if key in seen:
                raise ValueError(f"two models are named {key!r} ({seen[key]} and {m.path}); give one a `name`")
            seen[key] = m.path
        return self


class PortSpec(BaseModel):
    """One resolved port of a batch: an absolute source path and the full settings."""

    key: str
    source: str
    kind: Literal["folder", "archive"]
    settings: PortSettings


class ResolvedBatch(BaseModel):
    name: str
    ports: list[PortSpec]
    owner: str = ""
    """Part of the id for batches submitted through the API: two tokens sending the same manifest get
    two batches (the CLI leaves it empty)."""

    @property
    def batch_id(self) -> str:
        """Derived from the resolved content: the same manifest (same models, same settings) is the same
        batch, so running it again resumes it."""
        blob = json.dumps(self.model_dump(mode="json", exclude_defaults=True), sort_keys=True)
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def model_key(path: str) -> str:
    name = Path(path.rstrip("/")).name
    for suf in ARCHIVE_SUFFIXES:
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    key = re.sub(r"[^\w.-]", "_", name)[:64]
    return key if re.match(KEY_PATTERN, key) else f"m_{key}"[:64].rstrip(".") or "model"


def _kind(p: Path) -> Literal["folder", "archive"] | None:
    if p.is_dir():
        return "folder"
    if p.is_file() and p.name.endswith(ARCHIVE_SUFFIXES):
        return "archive"
    return None


def _merge(defaults: PortSettings, entry: ModelEntry) -> PortSettings:
    data = defaults.model_dump()
    for k, v in entry.model_dump(exclude={"path", "name"}, exclude_none=True).items():
        data[k] = {**data["budget"], **v} if k == "budget" else v
    return PortSettings.model_validate(data)


def _format_errors(exc: ValidationError, where: str) -> str:
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "manifest"
        lines.append(f"{where}: {loc}: {e['msg']}")
    return "\n".join(lines)


def resolve(manifest: BatchManifest, base: Path) -> ResolvedBatch:
    """Absolute sources and merged settings; every model must exist as a folder or an archive."""
    problems, ports = [], []
    for i, m in enumerate(manifest.models):
        p = Path(m.path).expanduser()
        p = (p if p.is_absolute() else base / p).resolve()
        kind = _kind(p)
        if kind is None:
            what = ("does not exist" if not p.exists()
                    else f"is neither a folder nor an archive ({', '.join(ARCHIVE_SUFFIXES)})")
            problems.append(f"models[{i}] ({m.path}): {p} {what}")
            continue
        try:
            settings = _merge(manifest.defaults, m)
        except ValidationError as exc:
            problems.append(_format_errors(exc, f"models[{i}] ({m.path})"))
            continue
        ports.append(PortSpec(key=m.name or model_key(m.path), source=str(p), kind=kind, settings=settings))
    if problems:
        raise BatchManifestError("\n".join(problems))
    return ResolvedBatch(name=manifest.name, ports=ports)


def load_manifest(path: Path, overrides: dict[str, Any] | None = None) -> ResolvedBatch:
    """A YAML manifest file, or a folder whose sub-folders and archives are the models (then
    ``overrides`` are the defaults). ``overrides`` also win over a file's defaults."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if path.is_dir():
        models = [{"path": str(c)} for c in sorted(path.iterdir())
                  if not c.name.startswith(".") and _kind(c) is not None]
        if not models:
            raise BatchManifestError(f"{path}: no model folders or archives inside")
        raw: Any = {"name": model_key(path.resolve().name or "batch"), "models": models}
        base = path
    else:
        if not path.is_file():
            raise BatchManifestError(f"{path}: no such manifest file or folder")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise BatchManifestError(f"{path}: not valid YAML: {first_line(exc)}") from exc
        if not isinstance(raw, dict):
            raise BatchManifestError(f"{path}: the manifest must be a mapping with `models:` (and optional "
                                     "`defaults:`)")
        base = path.resolve().parent
    if overrides:
        raw["defaults"] = {**(raw.get("defaults") or {}), **overrides}
    try:
        manifest = BatchManifest.model_validate(raw)
    except ValidationError as exc:
        raise BatchManifestError(_format_errors(exc, str(path))) from exc
    return resolve(manifest, base)
