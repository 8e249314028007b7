"""What ``npuport verify`` reads of a bundle, parsed into typed values before anything runs
(knowledge/untrusted.py's rule). A bundle is a stranger's: its report.json is the author's claims, never
npuport's instructions. So nothing of it names a host path verify opens, binds or runs:

- the original is the folder the user names (``--original``), checked against the report's digest;
- the target is re-resolved on this host from its name, chip and torch_npu (each from an allow-list:
  the target registry, the chip registry, the compatibility table); the op matrix is this host's;
- the environment is resolved again from the original (agents/environment), never the report's interpreter;
- the entry (npuport.yaml as the port ran it) has the planner's schema: a ``config`` inside the folder,
  ``module:attr`` references;
- the claims (tokens, throughput, profile, deployment) are numbers and short strings of fixed shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agents.reading.entry import Manifest
from agents.request import PortRequest
from knowledge.errors import UntrustedValue
from knowledge.untrusted import MAX_REPORT_BYTES, dtype_name, one_line, read_json_object

_SCALAR = str | int | float | bool | None
_KEY = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")  # what verify does not read is never read


class Entry(_Lenient):
    """The entry the port ran (agents/reading/entry.py EntryInfo.as_manifest_dict), of the planner's schema."""

    manifest: dict[str, Any]

    @classmethod
    def of(cls, raw: Any) -> Entry:
        if not isinstance(raw, dict):
            raise UntrustedValue("entry: not a mapping")
        known = {k: raw[k] for k in ("name", "entry", "config", "inputs", "decode", "run", "shrink") if k in raw}
        if "inputs" not in known:  # an auto_map entry without an inputs function: synthesised in the sandbox
            known["inputs"] = "npuport_synthesised:inputs"
        try:
            Manifest.model_validate({**known, "name": one_line(known.get("name") or "model", 64) or "model"})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise UntrustedValue(f"entry: {'.'.join(map(str, err['loc']))}: {err['msg']}") from exc
        overrides = raw.get("config_overrides")
        manifest = {k: raw[k] for k in ("name", "entry", "config", "inputs", "decode", "run", "shrink") if k in raw}
        if isinstance(overrides, dict):
            manifest["config_overrides"] = overrides  # config values, data to the run
        return cls(manifest=manifest)


class Numerics(_Lenient):
    port_tokens: list[list[int]] | None = None
    compared: Literal["tokens", "outputs"] | None = None
    dtype: str = "float32"

    @field_validator("compared", mode="before")
    @classmethod
    def _known(cls, v: Any) -> Any:
        return v if v in ("tokens", "outputs") else None


class Pathology(_Lenient):
    kind: str = Field(max_length=64)
    module: str | None = Field(default=None, max_length=200)
    where: str | None = Field(default=None, max_length=400)
    user_where: str | None = Field(default=None, max_length=400)  # the user's file:line (agents/sites.py)


class Perf(_Lenient):
    profiled: bool = False
    pathologies: list[Pathology] = Field(default_factory=list)


class Point(_Lenient):
    concurrency: int = Field(ge=1, le=4096)
    tokens_per_s: float | None = Field(default=None, ge=0)
    spread: float | None = Field(default=None, ge=0)


class Tuned(_Lenient):
    tokens_per_s: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, ge=1, le=4096)
    points: list[Point] = Field(default_factory=list)
    untuned: float | None = Field(default=None, gt=0)
    chosen: str | None = Field(default=None, max_length=64)


class Tuning(_Lenient):
    best: dict[str, _SCALAR] | None = None
    tuned: Tuned = Field(default_factory=Tuned)

    @field_validator("best")
    @classmethod
    def _knobs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        """A configuration is knob names of an identifier's shape and scalar values (data for the bench)."""
        import re

        if v is None:
            return None
        for k, val in v.items():
            if not re.match(_KEY, k) or (isinstance(val, str) and len(val) > 64):
                raise ValueError(f"tuning.best: {one_line(k, 40)!r} is not a knob")
        return v


class ServedTokens(_Lenient):
    served: list[list[int]] = Field(default_factory=list)
    reference_float32: list[list[int]] | None = None
    decided_by: str | None = Field(default=None, max_length=64)


class ServedRow(_Lenient):
    concurrency: int = Field(ge=1, le=256)
    output_tokens_per_s: float | None = Field(default=None, ge=0)


class ServedThroughput(_Lenient):
    rows: list[ServedRow] = Field(default_factory=list)


class Deployment(_Lenient):
    status: str | None = Field(default=None, max_length=64)
    tokens: ServedTokens = Field(default_factory=ServedTokens)
    throughput: ServedThroughput = Field(default_factory=ServedThroughput)


class BundleClaims(BaseModel):
    """The report's claims and the port's conditions, typed; ``request`` already points at the user's original."""

    request: PortRequest
    target_name: str
    entry: Entry
    original_digest: str | None = None
    numerics: Numerics = Field(default_factory=Numerics)
    perf: Perf = Field(default_factory=Perf)
    tuning: Tuning = Field(default_factory=Tuning)
    deployment: Deployment = Field(default_factory=Deployment)
    reference_adjusted: bool = False

    def state(self, workdir: Path, target: dict[str, Any], python: str | None) -> dict[str, Any]:
        """The graph state verify's runs and the deployment check read: this host's target and environment,
        the user's original, the report's entry; nothing else of the report."""
        return {"request": self.request.model_dump(), "entry": self.entry.manifest, "target": target,
                "environment": {"python": python}, "workdir": str(workdir),
                "runs": [{"reference_adjusted": True}] if self.reference_adjusted else []}


def _section(report: dict[str, Any], key: str) -> dict[str, Any]:
    value = report.get(key)
    return value if isinstance(value, dict) else {}


def _tuning(report: dict[str, Any]) -> Tuning:
    raw = _section(report, "tuning")
    tuned = raw.get("tuned") if isinstance(raw.get("tuned"), dict) else {}
    untuned = tuned.get("untuned") if isinstance(tuned.get("untuned"), dict) else {}
    return Tuning.model_validate({"best": raw.get("best") or None,
                                  "tuned": {**tuned, "untuned": untuned.get("tokens_per_s")}})


def read_claims(bundle: Path, original: Path) -> BundleClaims:
    """The bundle's report.json as typed claims, the request pointing at ``original``. Raises UntrustedValue
    with the field when a value is not of its kind (verify then checks nothing: not verified)."""
    report = read_json_object(bundle / "report.json", MAX_REPORT_BYTES, "report.json")
    raw_request = _section(report, "request")
    try:
        request = PortRequest.model_validate({**{k: v for k, v in raw_request.items() if k in PortRequest.model_fields},
                                              "model_path": str(original), "out_dir": None})
        numerics = _section(report, "numerics")
        digest = report.get("original_digest")
        return BundleClaims(
            request=request, target_name=str(_section(report, "target").get("name") or request.target),
            entry=Entry.of(report.get("entry")),
            original_digest=digest if isinstance(digest, str) and len(digest) == 64 else None,
            numerics=Numerics.model_validate({**numerics, "dtype": dtype_name(
                _section(numerics, "metrics").get("dtype"))}),
            perf=Perf.model_validate(_section(report, "perf")), tuning=_tuning(report),
            deployment=Deployment.model_validate(_section(report, "deployment")),
            reference_adjusted=any(isinstance(r, dict) and r.get("reference_adjusted") is True
                                   for r in report.get("runs") or [] if isinstance(report.get("runs"), list)))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UntrustedValue(f"report.json: {'.'.join(map(str, err['loc']))}: {one_line(err['msg'], 200)}") from exc
