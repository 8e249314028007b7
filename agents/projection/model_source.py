"""Where a projection's model comes from: a port's bundle (its ported code, the full-size config.json beside
it, the environment the port ran in, the host syncs and CPU fallbacks its decode profile counted, and how
vLLM served it), a model folder (its code and config; its environment resolved as a port resolves it), or a
running port's state (the reporter). ``model_cost`` builds the model on the meta device in that environment,
in the sandbox, and falls back to config arithmetic where the build fails, saying why."""

from __future__ import annotations

import functools
import hashlib
import json
import statistics
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.models import RunRecord
from agents.projection.config_cost import config_cost
from agents.projection.cost import ModelCost
from agents.projection.project import HostCosts
from agents.projection.structure import structure_cost
from agents.state import entry_of, environment_of, perf_of, runs_of, workdir_if_set
from knowledge.errors import UntrustedValue, first_line
from knowledge.untrusted import read_model_config

MEMO_MAX_FILE = 2 * 2**20
OWN_CODE_IMPLEMENTATIONS = ("transformers-backend",)
"""vLLM implementations that run the model's own code (agents/deploy/serving.py); vLLM's own classes do not."""


@dataclass
class ModelSource:
    name: str
    model_dir: Path
    manifest: dict[str, Any]
    config: dict[str, Any]
    python: str | None = None
    """The interpreter of the model's environment; None: npuport's own."""
    env_known: bool = False
    """The environment is the one a port resolved (``python`` None: the host's suffices): not resolved again."""
    host: HostCosts = field(default_factory=HostCosts)
    chip: str | None = None
    """The chip the port was asked for (a bundle's request)."""
    notes: list[str] = field(default_factory=list)


def _config(model_dir: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The model's config, read outside the sandbox: from inside its folder only (knowledge/untrusted.py)."""
    try:
        return read_model_config(model_dir, dict(manifest))
    except UntrustedValue:
        return {}


def host_costs(perf: Mapping[str, Any] | None, implementation: str | None,
               op_stats: Mapping[str, Any] | None = None, steps: int = 0) -> HostCosts:
    """Host syncs and CPU fallbacks per decode step of the model's own forward, and whether the serving runs
    that code. From the port's decode profile (report.json ``perf``: each step after the first, the prefill;
    only what happens inside the step: the generate loop around it is Transformers', which vLLM never runs);
    without one, from the op inventory of the port's last run (its totals over ``steps`` generated tokens)."""
    applies = implementation is None or implementation in OWN_CODE_IMPLEMENTATIONS
    served = (f"vLLM served it with {implementation}" if implementation else "not served here: assumed to run the "
              "model's own code (vLLM's Transformers backend)")
    tail = "" if applies else ", which does not run the model's own code: they do not apply"
    decode = list(((perf or {}).get("port") or {}).get("steps") or [])[1:]
    if decode:
        syncs = statistics.median(float(s.get("syncs") or 0) for s in decode)
        fallbacks = statistics.median(float(s.get("fallbacks") or 0) for s in decode)
        where = f"decode profile of the port (median of {len(decode)} steps, inside the step)"
    elif op_stats and steps:
        total = (op_stats.get("host_syncs") or {}).get("total") or 0
        falls = sum(int(v.get("count") or 0) for v in (op_stats.get("fallbacks") or {}).values() if isinstance(v, dict))
        syncs, fallbacks = float(total) / steps, float(falls) / steps
        where = f"op inventory of the port's last run (its totals over {steps} generated tokens)"
    else:
        return HostCosts(source="no decode profile or op inventory: no host syncs or CPU fallbacks counted")
    return HostCosts(syncs_per_step=syncs, fallbacks_per_step=fallbacks, applies=applies,
                     source=f"{where}: {syncs:g} host sync(s), {fallbacks:g} CPU fallback(s) per step; {served}{tail}")


def _last_op_stats(runs: list[RunRecord]) -> tuple[dict[str, Any] | None, int]:
    """The op inventory of the last successful port run and how many tokens it generated."""
    for run in reversed(runs):
        if run.purpose == "port" and run.ok and run.op_stats:
            return dict(run.op_stats), max((len(r) for r in run.tokens or []), default=0)
    return None, 0


def from_bundle(bundle: Path) -> ModelSource:
    from agents.request import request_of

    report = json.loads((bundle / "report.json").read_text())
    req = request_of(report)
    manifest = report.get("entry") or {}
    # A bundle may be someone else's: its model is its own patched/ tree, never a folder or an interpreter its
    # report names (docs/security.md); the model's environment is resolved here when the build needs one.
    model_dir = bundle / "patched"
    environment = report.get("environment") or {}
    implementation = (report.get("deployment") or {}).get("implementation")
    return ModelSource(name=Path(req.model_path or bundle.name).name, model_dir=model_dir,
                       manifest=manifest, config=_config(model_dir, manifest), python=None,
                       env_known=bool(environment.get("resolution")) and not environment.get("python"),
                       host=host_costs(report.get("perf"), implementation, *_last_op_stats(runs_of(report))),
                       chip=req.chip)


def from_folder(folder: Path) -> ModelSource:
    from agents.reading.entry import discover_entry

    manifest = discover_entry(folder).as_manifest_dict()
    return ModelSource(name=folder.resolve().name, model_dir=folder, manifest=manifest,
                       config=_config(folder, manifest))


def from_state(state: Mapping[str, Any], model_dir: Path | None = None,
               implementation: str | None = None) -> ModelSource | None:
    """A port's model as the reporter sees it (its workspace's patched tree, or ``model_dir``)."""
    workdir = workdir_if_set(state)
    folder = model_dir or (workdir / "model" if workdir else None)
    manifest = entry_of(state)
    if folder is None or not manifest.get("entry"):
        return None
    config = _config(folder, manifest)
    if not config:
        return None
    from agents.request import request_of

    environment = environment_of(state)
    python = environment.python
    req = request_of(state)
    return ModelSource(name=Path(str(req.model_path or folder)).name, model_dir=folder, manifest=manifest,
                       config=config, python=python if python and Path(python).exists() else None,
                       env_known=bool(environment.resolution) and not python,
                       host=host_costs(perf_of(state), implementation, *_last_op_stats(runs_of(state))),
                       chip=req.chip)


def model_digest(model_dir: Path) -> str:
    """What the model's code and configs are (file names and contents of its .py and .json files): the key of
    the memos below, so an edited model is read again."""
    h = hashlib.sha256()
    for path in sorted(p for ext in ("*.py", "*.json") for p in model_dir.rglob(ext)
                       if p.is_file() and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)):
        if path.stat().st_size > MEMO_MAX_FILE:
            continue  # a weights index or a tokenizer: not what the build reads
        h.update(str(path.relative_to(model_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _memo_dir() -> Path:
    from knowledge.home import cache_dir

    return cache_dir("projection")


def _remembered_env(digest: str) -> str | None:
    try:
        python = json.loads((_memo_dir() / "environments.json").read_text()).get(digest)
    except (OSError, ValueError):
        return None
    return python if isinstance(python, str) and Path(python).exists() else None


def _remember_env(digest: str, python: str) -> None:
    path = _memo_dir() / "environments.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known[digest] = python
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1))
    tmp.replace(path)


def model_environment(source: ModelSource, build: bool) -> tuple[str | None, str]:
    """The interpreter the meta build runs with: the source's own, else the model's layered environment as a
    port resolves it (built once when ``build``; minutes the first time; remembered under the npuport home
    for this model's code, so the next projection skips resolving it), else npuport's own; and a note."""
    if source.python or source.env_known:
        return source.python, "the port's environment" if source.python else "npuport's own environment, as the port's"
    digest = model_digest(source.model_dir)
    if (known := _remembered_env(digest)) is not None:
        return known, "the model's layered environment"
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve
    from knowledge.errors import EnvBuildError
    from sandbox.targets import DEFAULT_TORCH_NPU, EMULATED_TARGET

    try:
        resolution = resolve(source.model_dir, EMULATED_TARGET, DEFAULT_TORCH_NPU)
        if not resolution.needs_layered_env:
            return None, "npuport's own environment (the host satisfies the model's pins)"
        if not build:
            return None, (f"npuport's own environment (the model's, with {', '.join(resolution.install)}, is not "
                          "built: --build-env builds it once)")
        python = ensure_env(resolution)
    except EnvBuildError as exc:
        return None, f"npuport's own environment (the model's could not be built: {first_line(exc)})"
    if python:
        _remember_env(digest, str(python))
    return (str(python) if python else None), "the model's layered environment"


def model_cost(source: ModelSource, *, build_env: bool = True, timeout_s: float = 120.0) -> ModelCost:
    """The model's cost at full size: the meta build in its environment, config arithmetic where it fails."""
    python, env_note = model_environment(source, build_env)
    digest = hashlib.sha256(json.dumps(source.config, sort_keys=True, default=str).encode()).hexdigest()
    cost = _cost(str(source.model_dir.resolve()), json.dumps(source.manifest, sort_keys=True), digest, python,
                 timeout_s)
    return cost.model_copy(update={"notes": [*cost.notes, f"built with {env_note}"]})


def inventory_of(folder: Path, manifest: dict[str, Any], python: str | None, timeout_s: float) -> dict[str, Any]:
    """The meta build's inventory (sandbox/harness/meta_inventory.py), remembered under the npuport home by the
    model's code, manifest and interpreter: the same model is built once."""
    from sandbox.harness.meta_inventory import meta_inventory

    key = hashlib.sha256(json.dumps([model_digest(folder), manifest, python], sort_keys=True).encode()).hexdigest()
    memo = _memo_dir() / f"inventory-{key[:24]}.json"
    try:
        return dict(json.loads(memo.read_text()))
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="npuport-project-") as tmp:
        inventory = meta_inventory(folder, manifest, Path(tmp), python=python, wall_s=timeout_s)
    if inventory.get("ok"):
        memo.write_text(json.dumps(inventory))
    return inventory


@functools.lru_cache(maxsize=16)
def _cost(model_dir: str, manifest_json: str, config_digest: str, python: str | None, timeout_s: float) -> ModelCost:
    folder, manifest = Path(model_dir), json.loads(manifest_json)
    config = _config(folder, manifest)
    inventory = inventory_of(folder, manifest, python, timeout_s)
    if not inventory.get("ok"):
        return config_cost(config, f"the meta build failed: {str(inventory.get('error'))[:300]}")
    cost = structure_cost(inventory, config)
    if cost is None:
        return config_cost(config, f"the meta build of {inventory.get('class')} has no output layer over the "
                                   "vocabulary or no decoder stack the rules read")
    return cost
