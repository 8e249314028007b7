"""Environment resolution: which torch / torch_npu / CANN / vLLM / vllm-ascend / transformers a port
runs on, what the model itself pins, where those disagree (in plain words), and the sandbox
environment that honours the model's pins without touching the host's.

The sandbox environment is a venv layered on the host: it sees every package the host sees (a
``.pth`` file adds the host's site-packages and the npuport source root, after its own
site-packages) and installs only the model's pins that the host does not satisfy. torch, torch_npu
and vLLM are never installed there: the target decides them. Layered venvs are cached by a hash
of what they install, under ``$NPUPORT_ENV_CACHE`` or ``$NPUPORT_HOME/envs``.

    res = resolve(model_dir, EMULATED_TARGET, DEFAULT_TORCH_NPU)
    python = ensure_env(res) or Path(sys.executable)   # run the harness with this interpreter
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from agents.env_era import LAST_4X, era_transformers, model_couplings, own_versions, reconcile
from agents.env_imports import guarded_imports
from agents.env_owner import env_owner, provenance
from agents.env_pins import (  # noqa: F401  (re-exported)
    IMPORT_TO_DIST,
    RANK,
    Pin,
    find_pins,
    model_py_files,
    saved_transformers_version,
    transformers_names,
    unconditional_imports,
)
from agents.env_torch import COMPANIONS, TorchPair, choose_pair, probe
from agents.env_torch import minor_of as _minor
from agents.env_torch import release_of as _release
from knowledge.errors import (
    EnvBuildError,  # noqa: F401  (re-exported)
    first_line,
)
from sandbox.targets import TARGETS, get_target_spec

COMPAT_PATH = Path(__file__).with_name("data") / "compat.yaml"
NPUPORT_ROOT = Path(__file__).resolve().parents[1]  # holds agents/, sandbox/, ... (goes on the env's path)
MARKER = "npuport-env.json"
NPU_TARGETS = tuple(name for name, spec in TARGETS.items() if spec.npu_like)  # the target registry says

# The target decides these; a layered env never installs them (they come with the host or the NPU stack).
FRAMEWORK = {"torch", "torchvision", "torchaudio", "torch-npu", "vllm", "vllm-ascend", "triton-ascend"}


@dataclass
class Resolution:
    model_dir: Path
    target: str
    torch_npu: str | None
    stack: dict[str, str | None]  # python, torch, torch_npu, cann, transformers, vllm, vllm_ascend
    pins: dict[str, str]  # canonical name -> requirement the port uses ("transformers==4.46.3")
    found: list[Pin]  # every pin found in the model folder, with where
    conflicts: list[str]  # plain words, one per conflict
    notes: list[str]
    dropped: dict[str, str]  # canonical name -> why it is not installed
    install: list[str]  # requirements the layered env installs (the host does not satisfy them)
    requirements_txt: str
    constraints_txt: str
    needs_layered_env: bool
    host_python: str = field(default_factory=lambda: sys.executable)
    # torchvision / torchaudio the model imports or pins: the torch pair they run on is chosen and proven
    # when the environment is built (agents/env_torch.py), then recorded in torch_pair.
    companions: list[str] = field(default_factory=list)
    torch_pair: dict[str, Any] | None = None
    # guarded imports the code goes on to require: installed when the index has them, a failure is a note
    optional: list[str] = field(default_factory=list)
    era: str | None = None  # the transformers requirement of the model's era, when it runs in one
    owner: str = ""  # whose env this is ("": shared, npuport's pins only; agents/env_owner.py)

    @property
    def env_key(self) -> str:
        """Hash of what a layered env holds: its installs and the host it is layered on."""
        doc = {
            "install": sorted(self.install),
            "python": sys.version,
            "host": os.path.realpath(self.host_python),
            "host_sites": host_site_dirs(),
            "npuport_root": str(NPUPORT_ROOT),
            "torch_pair": {k: (self.torch_pair or {}).get(k) for k in ("base_env", "overlay", "torch")},
            **({"optional": sorted(self.optional)} if self.optional else {}),
            # an era's env is reconciled with the host packages it shadows (agents/env_era.py)
            **({"era_layout": 2} if self.era else {}),
            **({"owner": self.owner} if self.owner else {}),  # the model chose installs: its owner's env
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def summary(self) -> str:
        stack = ", ".join(f"{k} {v}" for k, v in self.stack.items() if v)
        env = (f"layered env installs {', '.join([*self.install, *self.optional])}" if self.needs_layered_env
               else "host env suffices")
        return f"{stack}; {env}; {len(self.conflicts)} conflict(s)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "torch_npu": self.torch_npu, "stack": self.stack, "pins": self.pins,
            "found": [vars(p) for p in self.found], "conflicts": self.conflicts, "notes": self.notes,
            "dropped": self.dropped, "install": self.install, "needs_layered_env": self.needs_layered_env,
            "env_key": self.env_key if self.needs_layered_env else None,
            "companions": self.companions, "torch_pair": self.torch_pair, "optional": self.optional,
            "owner": self.owner or None, "summary": self.summary(),
        }


# ---------------------------------------------------------------------------------------------
# The compatibility table (project data)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def load_compat(path: Path = COMPAT_PATH) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def torch_npu_row(version: str, compat: dict[str, Any]) -> dict[str, Any] | None:
    """The table's row for a torch_npu version; a bare release ('2.9.0') also matches its post builds."""
    table: dict[str, dict[str, Any]] = compat["torch_npu"]
    if version in table:
        return {"version": version, **table[version]}
    same = [(v, row) for v, row in table.items() if _release(v) == _release(version)]
    if not same:
        return None
    cann = sorted({c for _, row in same for c in row.get("cann", [])})
    return {"version": version, "torch": same[0][1]["torch"], "cann": cann,
            "note": f"not in the table as such; builds of torch_npu {_release(version)} list CANN {', '.join(cann)}"}


def companion_version(package: str, torch_version: str, compat: dict[str, Any]) -> str | None:
    """torchvision / torchaudio release line ('0.28.*') that pairs with a torch release."""
    rule = compat.get("torch_companions", {}).get(package)
    if not rule:
        return None
    major, minor = _minor(torch_version)
    if rule.get("same"):
        return f"{major}.{minor}.*"
    return f"0.{minor + int(rule['offset'])}.*" if major == 2 else None


# ---------------------------------------------------------------------------------------------
# The host
# ---------------------------------------------------------------------------------------------


def host_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def host_site_dirs() -> list[str]:
    """The host interpreter's site-packages (what a layered env must also see)."""
    return [d for d in site.getsitepackages() if os.path.isdir(d)]


def detect_cann() -> str | None:
    """The installed CANN toolkit's version, read from its install info (None without CANN)."""
    roots = [os.environ.get(k) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
    roots.append("/usr/local/Ascend/ascend-toolkit/latest")
    for root in filter(None, roots):
        for info in sorted(Path(root).glob("*/ascend_toolkit_install.info")) + [Path(root) / "version.cfg"]:
            if info.is_file():
                match = re.search(r"(?:^version=|_version=\[)([0-9][\w.]*)", info.read_text(errors="replace"), re.M)
                if match:
                    return match.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------------


def _cuda_only_reason(name: str, compat: dict[str, Any]) -> str | None:
    for pattern, reason in compat.get("cuda_only", {}).items():
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return str(reason)
    return None


def _exact(spec: SpecifierSet) -> str | None:
    """The version an exact pin names ('4.46.3' for '==4.46.3'), None otherwise."""
    return next((s.version for s in spec if s.operator in ("==", "===") and "*" not in s.version), None)


def _merge(name: str, pins: list[Pin], conflicts: list[str]) -> tuple[SpecifierSet, Pin]:
    """One specifier per package. The most authoritative exact pin wins; sources that disagree
    with it are reported and ignored."""
    ranked = sorted(pins, key=lambda p: RANK[p.kind])
    exact = next((p for p in ranked if any(s.operator in ("==", "===") for s in p.specifier)), None)
    lead = exact or ranked[0]
    merged = SpecifierSet()
    for pin in ranked:
        if exact is not None and pin is not exact:
            version = next(s.version for s in exact.specifier if s.operator in ("==", "==="))
            if pin.specifier and not pin.specifier.contains(version.rstrip(".*"), prereleases=True):
                conflicts.append(
                    f"{exact.source} pins {exact.requirement} but {pin.source} asks for {pin.requirement}; "
                    f"the port follows {exact.source}."
                )
                continue
        merged &= pin.specifier
    return merged, lead


def _stack_for_target(
    target: str, torch_npu: str | None, compat: dict[str, Any], conflicts: list[str], notes: list[str]
) -> dict[str, str | None]:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    host_torch = host_version("torch")
    stack: dict[str, str | None] = {"python": py, "torch": host_torch and _release(host_torch),
                                    "torch_npu": None, "cann": None}
    if target not in NPU_TARGETS or not torch_npu:
        notes.append(f"target {target} runs on the host's torch {host_torch}; no torch_npu or CANN involved.")
        return stack
    row = torch_npu_row(torch_npu, compat)
    stack["torch_npu"] = torch_npu
    if row is None:
        conflicts.append(f"torch_npu {torch_npu} is not in the compatibility table, so its torch and CANN "
                         "versions are unknown; pick a listed torch_npu release or add its row to agents/data/compat.yaml.")
        return stack
    need_torch = row["torch"]
    stack["torch"] = need_torch
    stack["cann"] = " or ".join(row["cann"]) or None
    if row.get("note"):
        notes.append(f"torch_npu {torch_npu}: {row['note']}.")
    if host_torch and _release(host_torch) != need_torch:
        where = ("the emulator runs it on the host's torch, so op coverage is that of the matrix but "
                 "numerics are the host torch's" if get_target_spec(target).emulated else "install the matching torch")
        conflicts.append(f"torch_npu {torch_npu} needs torch {need_torch}, but this host runs torch {host_torch} "
                         f"({where}).")
    pythons = compat.get("torch_python", {}).get(need_torch)
    if pythons and py not in pythons:
        conflicts.append(f"torch {need_torch} (for torch_npu {torch_npu}) supports Python {', '.join(pythons)}, "
                         f"but this host runs Python {py}.")
    cann = detect_cann()
    if get_target_spec(target).emulated:
        needs = f"CANN {stack['cann']}" if stack["cann"] else "the CANN release its build names (not in the tables yet)"
        notes.append(f"{target} needs no CANN; a real Ascend host needs {needs} for torch_npu {torch_npu}.")
    elif cann and row["cann"] and cann not in row["cann"]:
        conflicts.append(f"torch_npu {torch_npu} is published for CANN {' or '.join(row['cann'])}, but the installed "
                         f"CANN is {cann}; install a torch_npu build made for CANN {cann} or the matching CANN.")
    elif cann:
        stack["cann"] = cann
    return stack


def _framework_conflict(name: str, spec: SpecifierSet, lead: Pin, stack: dict[str, str | None],
                        target: str, compat: dict[str, Any]) -> str | None:
    """Plain words when a model pin on torch and friends disagrees with what the target runs."""
    torch_v = stack.get("torch")
    if not torch_v or not spec:
        return None
    if name == "torch" and not spec.contains(torch_v, prereleases=True):
        who = f"torch_npu {stack['torch_npu']} needs torch {torch_v}" if stack.get("torch_npu") \
            else f"the {target} target runs the host's torch {torch_v}"
        return f"{who}, but the model pins {lead.requirement} ({lead.source}); the port runs on torch {torch_v}."
    if name in ("torchvision", "torchaudio"):
        line = companion_version(name, torch_v, compat)
        if line and not spec.contains(line.replace(".*", ".0"), prereleases=True):
            return (f"the model pins {lead.requirement} ({lead.source}), which is built for another torch; "
                    f"torch {torch_v} pairs with {name} {line}, which the port uses.")
    if name == "torch-npu" and stack.get("torch_npu") and not spec.contains(stack["torch_npu"] or "", prereleases=True):
        return f"the model pins {lead.requirement} ({lead.source}) but the port targets torch_npu {stack['torch_npu']}."
    return None


def _vllm_ascend_for(vllm_spec: SpecifierSet | None, torch_npu: str | None,
                     compat: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    rows: dict[str, dict[str, Any]] = compat.get("vllm_ascend", {})
    ordered = sorted(rows.items(), key=lambda kv: Version(kv[0]), reverse=True)
    if vllm_spec:
        return next(((v, r) for v, r in ordered if vllm_spec.contains(r["vllm"], prereleases=True)), None)
    if torch_npu:
        return next(((v, r) for v, r in ordered if _release(r["torch_npu"]) == _release(torch_npu)), None)
    return None


def _resolve_vllm(merged: dict[str, tuple[SpecifierSet, Pin]], stack: dict[str, str | None],
                  compat: dict[str, Any], conflicts: list[str], notes: list[str]) -> None:
    if "vllm" not in merged and "vllm-ascend" not in merged:
        return
    vllm_spec = merged["vllm"][0] if "vllm" in merged else None
    if "vllm-ascend" in merged and merged["vllm-ascend"][0]:
        spec = merged["vllm-ascend"][0]
        hit = next(((v, r) for v, r in compat.get("vllm_ascend", {}).items()
                    if spec.contains(v, prereleases=True)), None)
    else:
        hit = _vllm_ascend_for(vllm_spec, None if vllm_spec else stack.get("torch_npu"), compat)
    if hit is None:
        newest_v, newest = max(compat["vllm_ascend"].items(), key=lambda kv: Version(kv[0]))
        wanted = f"vLLM {vllm_spec}" if vllm_spec else f"torch_npu {stack.get('torch_npu')}"
        conflicts.append(
            f"no published vllm-ascend release pairs with {wanted} (the newest, v{newest_v}, runs vLLM "
            f"{newest['vllm']} on torch {newest['torch']} / torch_npu {newest['torch_npu']} and CANN {newest['cann']}); "
            "serving with vLLM on Ascend needs that stack."
        )
        return
    version, row = hit
    stack["vllm"], stack["vllm_ascend"] = row["vllm"], version
    notes.append(f"vllm-ascend {version} plugs into vLLM {row['vllm']} and was tested on torch_npu {row['torch_npu']}, "
                 f"CANN {row['cann']}, Python {row['python']}.")
    if stack.get("torch_npu") and _release(row["torch_npu"]) != _release(stack["torch_npu"] or ""):
        conflicts.append(f"vllm-ascend {version} (for vLLM {row['vllm']}) needs torch_npu {row['torch_npu']} with "
                         f"torch {row['torch']}, but the port targets torch_npu {stack['torch_npu']}; serve the port "
                         "with that stack, or run it without vLLM.")
    py = stack.get("python") or ""
    if not SpecifierSet(row["python"]).contains(py + ".0"):
        conflicts.append(f"vllm-ascend {version} supports Python {row['python']}, but this host runs Python {py}.")
    needs_tf = compat.get("vllm", {}).get(row["vllm"], {}).get("transformers")
    if needs_tf and "transformers" in merged:
        spec, lead = merged["transformers"]
        exact = _exact(spec)
        if exact and not SpecifierSet(needs_tf).contains(exact, prereleases=True):
            conflicts.append(f"the model pins {lead.requirement} ({lead.source}) but vLLM {row['vllm']} "
                             f"(for vllm-ascend {version}) needs transformers{needs_tf}; the sandbox keeps the model's "
                             "pin, and serving it with vLLM needs the model ported to a newer transformers.")


def resolve(model_dir: Path, target: str, torch_npu: str | None) -> Resolution:
    """Resolve the environment a port of ``model_dir`` runs in for ``target`` (cpu | ascend-sim | npu
    | auto) on ``torch_npu`` (a torch_npu release such as "2.13.0")."""
    model_dir = Path(model_dir).resolve()
    compat = load_compat()
    conflicts: list[str] = []
    notes: list[str] = []
    stack = _stack_for_target(target, torch_npu, compat, conflicts, notes)

    found = find_pins(model_dir)
    by_name: dict[str, list[Pin]] = {}
    for pin in found:
        by_name.setdefault(pin.name, []).append(pin)
    merged = {name: _merge(name, pins, conflicts) for name, pins in by_name.items()}

    pins: dict[str, str] = {}
    dropped: dict[str, str] = {}
    install: list[str] = []
    companions: list[str] = []
    for name, (spec, lead) in sorted(merged.items()):
        req = Requirement(lead.requirement)
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        requirement = f"{name}{extras}{spec}"
        cuda = _cuda_only_reason(name, compat)
        if cuda:
            dropped[name] = f"CUDA-only ({cuda})"
            conflicts.append(f"the model needs {lead.requirement} ({lead.source}), which is CUDA-only ({cuda}) and "
                             "cannot run on Ascend; it is left out and the port removes or replaces its uses (H3).")
            continue
        if name in FRAMEWORK:
            problem = _framework_conflict(name, spec, lead, stack, target, compat)
            if problem:
                conflicts.append(problem)
            dropped[name] = "decided by the target (never installed into the sandbox env)"
            if name in COMPANIONS:
                dropped[name] = "paired with the torch the port runs on (chosen and proven when the env is built)"
                companions.append(name)
            continue
        pins[name] = requirement
        have = host_version(name)
        if have is None or (spec and not spec.contains(have, prereleases=True)):
            install.append(requirement)
            host = f"the host has {have}" if have else "the host does not have it"
            notes.append(f"{requirement} ({lead.source}): {host}; installed into the layered environment.")
    _resolve_vllm(merged, stack, compat, conflicts, notes)

    host_tf = host_version("transformers")
    saved = saved_transformers_version(model_dir)
    era = era_transformers(saved, host_tf) if "transformers" not in pins else None
    coupled = model_couplings(model_dir) if host_tf and _minor(host_tf)[0] >= 5 else []
    if coupled and "transformers" not in pins and not era and not (saved and _minor(saved)[0] >= 5):
        # config.json names no era, but the code is coupled to 4.x: the last 4.x release runs it
        era = LAST_4X
    if era:
        # The release the authors ran: code written for 4.x runs under 5.x as long as every name it
        # imports exists, then breaks at run time (no inherited generate, config attributes moved to the
        # generation config, removed helpers). Both the reference and the port run in the era's env.
        pins["transformers"] = era
        install.append(era)
        missing = missing_transformers_names(model_dir)
        shown = "; the host's release also lacks " + ", ".join(
            f"{mod}.{name} ({where})" for mod, name, where in missing[:4]) if missing else ""
        why = (f"config.json was saved with transformers {saved} and the host has {host_tf} (another major release)"
               if saved and era != LAST_4X else
               f"config.json names no transformers release and the code is coupled to 4.x ({coupled[0]})")
        if coupled and saved and era != LAST_4X:
            why += f"; the code is coupled to it ({coupled[0]}{f' and {len(coupled) - 1} more' if len(coupled) > 1 else ''})"
        notes.append(f"{why}: the original and the port run in the environment of the model's era, {era}, built "
                     f"once from the package index and shared by every port of that era{shown}.")
    elif saved and host_tf:
        notes.append(f"config.json was saved with transformers {saved} and the host has {host_tf} (same major "
                     "release): the host's transformers is kept.")
    if era and target in NPU_TARGETS and "einops" not in pins and host_version("einops") is None:
        # transformers 4.x on an Ascend host (torch_npu importable) imports its NPU flash-attention
        # integration, which imports einops unconditionally
        pins["einops"] = "einops"
        install.append("einops")
        notes.append(f"{era} imports einops on an Ascend target (transformers.integrations.npu_flash_attention): "
                     "einops is installed into the layered environment.")
    _imported_dependencies(model_dir, pins, dropped, install, notes, compat, stack, companions)
    optional = _guarded_dependencies(model_dir, pins, dropped, notes, compat)
    tf_exact = _exact(SpecifierSet(str(Requirement(pins["transformers"]).specifier))) if "transformers" in pins else None
    # an era's range (transformers~=4.36.0) is shown as it is: pip picks its newest patch when the env is built
    stack["transformers"] = tf_exact or (str(Requirement(era).specifier) if era else host_tf)

    requirements_txt, constraints_txt = _bundle_files(target, stack, pins, compat)
    return Resolution(
        model_dir=model_dir, target=target, torch_npu=stack.get("torch_npu"), stack=stack, pins=pins,
        found=found, conflicts=conflicts, notes=notes, dropped=dropped, install=install,
        requirements_txt=requirements_txt, constraints_txt=constraints_txt,
        needs_layered_env=bool(install) or bool(companions) or bool(optional), companions=sorted(set(companions)),
        optional=optional, era=era,
    )


def _guarded_dependencies(model_dir: Path, pins: dict[str, str], dropped: dict[str, str], notes: list[str],
                          compat: dict[str, Any]) -> list[str]:
    """Packages imported inside try/except that the code then requires (agents/env_imports.py): the host's
    when it has them, else installed into the layered environment when the package index has them (a
    failed install is a note, not a failed build: the import is optional to the code's authors)."""
    from packaging.utils import canonicalize_name

    optional: list[str] = []
    for module, where in sorted(guarded_imports(model_dir, model_py_files(model_dir)).items()):
        dist = str(canonicalize_name(IMPORT_TO_DIST.get(module, module)))
        if dist in pins or dist in dropped or dist in FRAMEWORK or dist in ("torch-npu", "npuport", "sandbox"):
            continue
        cuda = _cuda_only_reason(dist, compat)
        if cuda:
            dropped[dist] = f"CUDA-only ({cuda}); a guarded import the code demands: the port removes or replaces its uses (H3)"
            continue
        if host_version(dist) is not None:
            pins[dist] = dist
            continue
        pins[dist] = dist
        optional.append(dist)
        notes.append(f"{module} is imported inside try/except ({where}) and the code demands it: {dist} is "
                     "installed into the layered environment when the package index has it.")
    return optional


def _imported_dependencies(model_dir: Path, pins: dict[str, str], dropped: dict[str, str], install: list[str],
                           notes: list[str], compat: dict[str, Any], stack: dict[str, str | None],
                           companions: list[str]) -> None:
    """Third-party packages the model's code imports unconditionally that no file pins: the host's
    version when it has one, else installed into the layered environment. torchvision / torchaudio are
    companions of torch: the pair is chosen and proven when the environment is built (agents/env_torch.py)."""
    from packaging.utils import canonicalize_name

    for module, where in sorted(unconditional_imports(model_dir).items()):
        dist = str(canonicalize_name(IMPORT_TO_DIST.get(module, module)))
        if dist in COMPANIONS:
            if dist not in companions:
                companions.append(dist)
                dropped.setdefault(dist, "paired with the torch the port runs on (chosen and proven when the env "
                                         "is built)")
                notes.append(f"{module} is imported by the model ({where}): it must be built for the torch it "
                             "runs with, so the torch pair is chosen and proven by importing it when the "
                             "environment is built.")
            continue
        if dist in pins or dist in dropped or dist in ("torch", "torch-npu", "npuport", "sandbox"):
            continue
        if _cuda_only_reason(dist, compat):
            continue  # H3's business: the port removes or replaces its uses
        if host_version(dist) is not None:
            pins[dist] = dist
            continue
        if dist in FRAMEWORK:
            dropped[dist] = "decided by the target (never installed into the sandbox env)"
            continue
        requirement = dist
        pins[dist] = requirement
        install.append(requirement)
        notes.append(f"{module} is imported by the model ({where}) and the host does not have it: {requirement} is "
                     "installed into the layered environment.")


def missing_transformers_names(model_dir: Path, python: str | None = None) -> list[tuple[str, str, str]]:
    """The (module, name, where) the model imports from transformers that the installed transformers
    lacks (a removed or renamed API), checked in a child interpreter (importing transformers is slow
    and must not happen in npuport's own process)."""
    wanted = transformers_names(model_dir)
    if not wanted:
        return []
    probe = ("import importlib, json, sys\n"
             "out = []\n"
             "for mod, name, where in json.loads(sys.stdin.read()):\n"
             "    try:\n"
             "        m = importlib.import_module(mod)\n"
             "        ok = hasattr(m, name) or importlib.util.find_spec(mod + '.' + name) is not None\n"
             "    except Exception:\n"
             "        ok = False\n"
             "    if not ok:\n"
             "        out.append([mod, name, where])\n"
             "print(json.dumps(out))\n")
    try:
        from sandbox.probe import run_probe  # the env's .pth files run when it starts: inside the sandbox

        done = run_probe([python or sys.executable, "-c", probe], input=json.dumps(wanted), timeout=120)
        return [tuple(x) for x in json.loads(done.stdout.strip().splitlines()[-1])] if done.returncode == 0 else []
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return []


def _bundle_files(target: str, stack: dict[str, str | None], pins: dict[str, str],
                  compat: dict[str, Any], pair: dict[str, Any] | None = None) -> tuple[str, str]:
    """requirements.txt (what the port needs) and constraints.txt (the versions it was validated
    with) for the bundle. With a torch pair (agents/env_torch.py), both pin the pair that ran."""
    header = f"# Generated by npuport for target {target}"
    if stack.get("torch_npu"):
        header += f", torch_npu {stack['torch_npu']}" + (f" (CANN {stack['cann']})" if stack.get("cann") else "")
    req_lines = [header]
    con_lines = [header]
    torch_v = stack.get("torch")
    if pair:
        why = f"# validated on torch {pair['torch']} + " + " + ".join(f"{c} {v}" for c, v in
                                                                   sorted(pair["companions"].items()))
        req_lines.append(why)
        con_lines.append(why)
        torch_v = _release(str(pair["torch"]))
        req_lines.append(f"torch=={torch_v}")
        con_lines.append(f"torch=={torch_v}")
        for companion, version in sorted(pair["companions"].items()):
            req_lines.append(f"{companion}=={_release(str(version))}")
            con_lines.append(f"{companion}=={_release(str(version))}")
    elif torch_v:
        req_lines.append(f"torch=={torch_v}")
        con_lines.append(f"torch=={torch_v}")
        for companion in ("torchvision", "torchaudio"):
            line = companion_version(companion, torch_v, compat)
            if line:
                con_lines.append(f"{companion}=={line}")
    if stack.get("torch_npu"):
        req_lines.append(f"torch-npu=={stack['torch_npu']}")
        con_lines.append(f"torch-npu=={stack['torch_npu']}")
    if stack.get("vllm_ascend"):
        req_lines.append(f"vllm-ascend=={stack['vllm_ascend']}")
        con_lines.append(f"vllm=={stack['vllm']}")
    for name, requirement in sorted(pins.items()):
        req_lines.append(requirement)
        exact = _exact(Requirement(requirement).specifier)
        if exact:
            con_lines.append(f"{name}=={exact}")
    return "\n".join(req_lines) + "\n", "\n".join(con_lines) + "\n"


# ---------------------------------------------------------------------------------------------
# The layered environment
# ---------------------------------------------------------------------------------------------


def env_cache_root() -> Path:
    from knowledge.settings import settings

    env = settings().env_cache
    if env:
        root = env.expanduser()
    else:
        from knowledge.home import cache_dir

        root = cache_dir("envs")
    root.mkdir(parents=True, exist_ok=True)
    return root


def env_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two ports building the same env wait for each other
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _layer_pth(env_dir: Path, resolution: Resolution) -> Path:
    """The .pth that layers the env on the host: a torch pair's base env (its own torch shadows the
    host's), then the host's site-packages (processed as site dirs, so their own .pth files work), after
    the env's own, and the npuport source root for the harness."""
    purelib = _purelib(env_python(env_dir))
    sites = [*_base_sites(resolution), *host_site_dirs()]
    pth = Path(purelib) / "_npuport_layer.pth"
    pth.write_text(
        f"import site; list(map(site.addsitedir, {sites!r}))\n"
        f"{NPUPORT_ROOT}\n"
    )
    return pth


def _purelib(python: Path) -> str:
    # -S: no .pth of the env runs outside the sandbox. Without site, sys.prefix is the base interpreter's,
    # so the env's own prefix (python's bin/..) is passed in.
    code = "import sys, sysconfig; print(sysconfig.get_paths(vars={'base': sys.argv[1], 'platbase': sys.argv[1]})['purelib'])"
    return subprocess.run([str(python), "-I", "-S", "-c", code, str(Path(python).parent.parent)],
                          capture_output=True, text=True, check=True).stdout.strip()


def _base_sites(resolution: Resolution) -> list[str]:
    base = (resolution.torch_pair or {}).get("base_env")
    return [_purelib(env_python(Path(base)))] if base else []


def _run_pip(python: Path, install: list[str], constraints: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    # Wheels only (no setup.py), and in the sandbox: the env's interpreter runs the .pth files of the wheels
    # installed before; only the env folder is writable, the network reaches only the index (sandbox/installs.py).
    from sandbox.installs import run_pip

    argv = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--only-binary=:all:",
            "-c", str(constraints), *install]
    return run_pip(argv, writable=(Path(python).parent.parent,), timeout=timeout_s)


def _stderr_log(msg: str) -> None:
    print(f"npuport: {msg}", file=sys.stderr, flush=True)


def apply_pair(resolution: Resolution, pair: TorchPair) -> None:
    """Record the chosen torch pair in the resolution: stack, notes, installs, bundle files."""
    resolution.torch_pair = pair.as_dict()
    resolution.stack["torch"] = _release(pair.torch)
    for c, v in pair.companions.items():
        resolution.stack[c] = v
    resolution.notes.append(f"torch pair: torch {pair.torch} + "
                            + " + ".join(f"{c} {v}" for c, v in sorted(pair.companions.items()))
                            + f" ({pair.source}): {pair.reason}. Proof: {pair.proof}."
                            + (" It is a CUDA build (several GB, its CUDA unused here): the only pair the package "
                               "index here offers that loads; a CPU build of the same pair is lighter where an "
                               "index offers one." if "+cu" in pair.proof else ""))
    for req in pair.overlay:
        if req not in resolution.install:
            resolution.install.append(req)
    if pair.source != "host" and resolution.target in NPU_TARGETS and resolution.torch_npu and \
            _release(pair.torch) != _release(str(_stack_torch_npu_torch(resolution) or pair.torch)):
        resolution.conflicts.append(
            f"the sandbox runs torch {pair.torch} (the pair that loads {', '.join(resolution.companions)} here); "
            f"on an Ascend host torch_npu {resolution.torch_npu} needs its own torch and the "
            f"{'/'.join(resolution.companions)} release of that line.")
    resolution.needs_layered_env = bool(resolution.install) or pair.source == "index"
    resolution.requirements_txt, resolution.constraints_txt = _bundle_files(
        resolution.target, resolution.stack, resolution.pins, load_compat(), resolution.torch_pair)


def _stack_torch_npu_torch(resolution: Resolution) -> str | None:
    row = torch_npu_row(resolution.torch_npu, load_compat()) if resolution.torch_npu else None
    return row["torch"] if row else None


def ensure_env(resolution: Resolution, cache_root: Path | None = None, timeout_s: float = 900.0,
               log: Callable[[str], None] | None = None) -> Path | None:
    """The python of the layered venv for ``resolution`` (built once, then reused), or None when the
    host already satisfies every pin. When the model imports torchvision / torchaudio, the torch pair is
    chosen and proven first (agents/env_torch.py) and recorded in the resolution. Raises EnvBuildError
    when installing fails."""
    log = log or _stderr_log
    root = cache_root or env_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    if resolution.companions and resolution.torch_pair is None:
        pair = choose_pair(resolution.companions, resolution.host_python, host_version("torch"), load_compat(),
                           root, log)
        apply_pair(resolution, pair)
    if not resolution.needs_layered_env:
        return None
    resolution.owner = env_owner(resolution)
    python = _ensure_layered(resolution, root, timeout_s, log)
    pulled = [c for c in COMPANIONS if c in own_versions(python)] if resolution.torch_pair is None else []
    if pulled:
        # a dependency (timm -> torchvision) brought a companion built for another torch: prove it before any
        # model code runs, and when it does not load, choose the pair as for a model that imports it
        ok, proof = probe(str(python), pulled)
        if not ok:
            resolution.notes.append(f"{', '.join(pulled)} came in with the model's dependencies and does not load "
                                    f"beside the env's torch ({proof}): the torch pair is chosen and proven.")
            resolution.companions = sorted(set(resolution.companions) | set(pulled))
            apply_pair(resolution, choose_pair(resolution.companions, resolution.host_python, host_version("torch"),
                                               load_compat(), root, log))
            resolution.owner = env_owner(resolution)
            python = _ensure_layered(resolution, root, timeout_s, log)
    if resolution.era and resolution.era != LAST_4X:
        missing = missing_transformers_names(resolution.model_dir, python=str(python))
        if missing:
            # config.json's release is older than the code: it imports names that came later (a checkpoint
            # saved with 4.24 by code that imports GenerationConfig, 4.26+). The last 4.x has them all.
            shown = ", ".join(f"{mod}.{name} ({where})" for mod, name, where in missing[:3])
            resolution.install = [LAST_4X if r == resolution.era else r for r in resolution.install]
            resolution.pins["transformers"] = LAST_4X
            resolution.stack["transformers"] = str(Requirement(LAST_4X).specifier)
            resolution.notes.append(f"the era's {resolution.era} lacks {shown}, which the code imports: it runs "
                                    f"with {LAST_4X} instead.")
            resolution.era = LAST_4X
            resolution.owner = env_owner(resolution)
            python = _ensure_layered(resolution, root, timeout_s, log)
    if resolution.era and (installed := own_versions(python).get("transformers")):
        resolution.stack["transformers"] = installed  # the release pip chose for the era's range
    marker = json.loads((python.parent.parent / MARKER).read_text())
    for dist, outcome in (marker.get("reconciled") or {}).items():
        resolution.notes.append(f"host package {dist} needs newer releases than the era's: {outcome}.")
    return python


def _ensure_layered(resolution: Resolution, root: Path, timeout_s: float, log: Callable[[str], None]) -> Path:
    env_dir = root / resolution.env_key
    with _locked(root / f"{resolution.env_key}.lock"):
        if (env_dir / MARKER).is_file() and env_python(env_dir).exists():
            return env_python(env_dir)
        shutil.rmtree(env_dir, ignore_errors=True)  # a build that died half way
        if resolution.install:
            log(f"building the model's layered environment ({', '.join(resolution.install)}) in {env_dir}")
        try:
            _build(env_dir, resolution, timeout_s)
        except BaseException:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise
    return env_python(env_dir)


def _build(env_dir: Path, resolution: Resolution, timeout_s: float) -> None:
    host = Path(resolution.host_python)
    # --without-pip: pip comes from the host's site-packages through the layer .pth.
    made = subprocess.run([str(host), "-m", "venv", "--without-pip", str(env_dir)], capture_output=True, text=True)
    if made.returncode != 0:
        raise EnvBuildError(f"could not create a venv at {env_dir}: {made.stderr.strip()[-800:]}")
    _layer_pth(env_dir, resolution)
    # Keep the torch stack as it is (the host's, or the pair's): the model's pins must not move it.
    pair = resolution.torch_pair or {}
    if pair.get("base_env"):
        keep = [f"torch=={pair['torch']}", *(f"{c}=={v}" for c, v in sorted(pair["companions"].items()))]
    else:
        keep = [f"{n}=={v}" for n in sorted(FRAMEWORK) if (v := host_version(n))]
    constraints = env_dir / "npuport-constraints.txt"
    constraints.write_text("\n".join(keep) + "\n")
    start = time.monotonic()
    if resolution.install:
        try:
            done = _run_pip(env_python(env_dir), resolution.install, constraints, timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise EnvBuildError(f"installing {', '.join(resolution.install)} into the layered environment took "
                                f"longer than {timeout_s:g} s and was stopped") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            raise EnvBuildError(
                f"could not install {', '.join(resolution.install)} into the layered environment at {env_dir} "
                f"(pip exit {done.returncode}); the model's pins may not exist for Python "
                f"{sys.version_info.major}.{sys.version_info.minor}, may need torch other than the host's, or the "
                f"package registry may be unreachable:\n{tail}"
            )
    optional_failed = _install_optional(env_dir, resolution, constraints, timeout_s)
    reconciled = reconcile(env_python(env_dir), _run_pip, keep, timeout_s) if resolution.era else {}
    (env_dir / MARKER).write_text(json.dumps({
        "key": resolution.env_key, "install": resolution.install, "optional": resolution.optional,
        "optional_failed": optional_failed, "reconciled": reconciled, "host_python": resolution.host_python,
        "host_sites": host_site_dirs(), "npuport_root": str(NPUPORT_ROOT),
        "built_s": round(time.monotonic() - start, 1), "model_dir": str(resolution.model_dir),
        "torch_pair": resolution.torch_pair,
        "owner": resolution.owner or None, "provenance": provenance(resolution),  # agents/env_owner.py
        # Folders the env reads besides its own (the sandbox binds them read-only: sandbox/process.py).
        "layers": [str(Path(pair["base_env"]).resolve())] if pair.get("base_env") else [],
    }, indent=1))


def _install_optional(env_dir: Path, resolution: Resolution, constraints: Path, timeout_s: float) -> dict[str, str]:
    """Install each guarded import's package on its own; {package: why not} for those the index lacks."""
    failed: dict[str, str] = {}
    for req in resolution.optional:
        try:
            done = _run_pip(env_python(env_dir), [req], constraints, timeout_s)
        except subprocess.TimeoutExpired:
            failed[req] = f"pip took longer than {timeout_s:g} s"
            continue
        if done.returncode != 0:
            failed[req] = ((done.stderr or done.stdout).strip().splitlines() or ["pip failed"])[-1][:300]
            _stderr_log(f"optional {req} not installed (the code's fallback runs): {failed[req]}")
    return failed


def native_for(target: Any, python: str) -> Any:
    """The target with ascend-sim's native engine built for the torch of ``python`` (a torch pair's env
    runs its own torch, and a library built for another torch does not load); other targets unchanged."""
    from sandbox.ascend_sim.native_build import NativeUnavailable, choose_engine
    from sandbox.targets import Target

    if not (target.options or {}).get("native_lib"):
        return target
    try:
        engine, lib, why = choose_engine("auto", log=_stderr_log, python=python)
    except (NativeUnavailable, ValueError) as exc:
        engine, lib, why = "python", None, f"native engine unavailable ({first_line(exc)}); python engine"
    if lib == target.options.get("native_lib"):
        return target
    options = {**target.options, "engine": engine, "native_lib": lib, "engine_note": f"{why} (for {python})"}
    return Target(target.name, target.device, target.bootstrap, options, target.env, reason=target.reason)
