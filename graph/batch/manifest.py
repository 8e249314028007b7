"""The batch manifest (YAML): defaults at the top, then the models; or a folder of model folders.

```yaml
name: zoo
defaults:                # any field of agents/request.py's PortRequest but model_path and out_dir (the batch's)
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from agents.request import MAX_WALL_S, PortRequest, fields_of, request_fields
from knowledge.errors import BatchManifestError, first_line

MAX_MEMORY_MB = 1024 * 1024  # a port's memory request (1 TiB): a ceiling, not a default

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
KEY_PATTERN = r"^\w[\w.-]{0,63}$"
"""A port's key and a batch's name: they name folders under the batch's own (staging, bundles, job files)."""


BUDGET_FIELDS = ("max_runs", "max_wall_s", "run_timeout_s")
"""The request's budget fields: a manifest nests them under ``budget:``."""
BATCH_SETS = ("model_path", "out_dir")
"""The request's fields the batch sets itself: the staged model and the port's bundle folder."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(create_model("_Budget", __base__=_Strict, **request_fields(only=BUDGET_FIELDS))):  # type: ignore[misc]
    """The request's budget fields (``budget:`` in a manifest)."""


class _BatchSettings(_Strict):
    """What a port of a batch has beyond its request: its budget (the request's, nested) and the batch's
    own limits."""

    budget: Budget = Field(default_factory=Budget)
    timeout_s: float = Field(default=3600.0, gt=0, le=MAX_WALL_S, description="the batch kills a port that "
                                                                              "runs longer")
    num_cpus: float = Field(default=1.0, gt=0, le=256, description="declared to Ray, so its scheduler packs ports")
    memory_mb: int = Field(default=2048, ge=64, le=MAX_MEMORY_MB, description="declared to Ray")
    threads: int = Field(default=1, ge=1, le=256, description="compute threads of the port's runs")

    def request_values(self) -> dict[str, Any]:
        """The port's PortRequest fields (less model_path and out_dir, the batch's): a ``shrink`` dict is the
        request's shrink on (its overrides go into the staged copy's config, graph/batch/sources.py)."""
        values = self.model_dump(include=set(PortRequest.model_fields))
        values.update(self.budget.model_dump(), shrink=bool(values.get("shrink")))
        return values


# A manifest's `shrink:` may also be a dict of config overrides (graph/batch/sources.py stages them).
_SHRINK = (bool | dict[str, Any], Field(False, description="true: the small config of `npuport port --shrink`; "
                                                           "a dict: also these config overrides"))

class PortSettings(create_model(  # type: ignore[misc]
        "_PortSettings", __base__=_BatchSettings,
        **{**request_fields(exclude=(*BATCH_SETS, *BUDGET_FIELDS)), "shrink": _SHRINK})):
    """Settings of one port: every PortRequest field the batch does not set itself, and the batch's own; a
    model entry may leave any out to take the batch default."""


class _Entry(_Strict):
    path: str
    # a folder name of npuport's (staging, bundle, job files): never "." or "..", never a path
    name: str | None = Field(default=None, pattern=KEY_PATTERN)
    budget: dict[str, Any] | None = None  # merged into the defaults' budget, key by key


class ModelEntry(create_model("_ModelEntry", __base__=_Entry,  # type: ignore[misc]
                              **fields_of(PortSettings, exclude=("budget",), partial=True))):
    """One model of a manifest: its source, and any settings of its own (the others: the defaults')."""


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
    """A model's settings: its entry's fields over the defaults (its budget key by key)."""
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
