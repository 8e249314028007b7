"""The resolution of a port's environment (what resolve() decided, for the graph state, the report and the
layered env) and the bundle's requirements.txt / constraints.txt."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from agents.environment.compat import NPUPORT_ROOT, companion_version, exact_version, host_site_dirs
from agents.environment.pins import Pin
from agents.environment.torch_pair import release_of as _release


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
    # when the environment is built (agents/environment/torch_pair.py), then recorded in torch_pair.
    companions: list[str] = field(default_factory=list)
    torch_pair: dict[str, Any] | None = None
    # guarded imports the code goes on to require: installed when the index has them, a failure is a note
    optional: list[str] = field(default_factory=list)
    era: str | None = None  # the transformers requirement of the model's era, when it runs in one
    # What the era's base env installs (the era's transformers, and einops on an Ascend target): one env per
    # era, shared by every port of it; the model's own layer sits on it (agents/environment/layered.py).
    era_installs: list[str] = field(default_factory=list)
    era_base: str | None = None  # the era's base env the model's env is layered on, once built
    era_last: str | None = None  # the newest 4.x the code runs with (LAST_4X, or below a coupling's release)
    owner: str = ""  # whose env this is ("": shared, npuport's pins only; agents/environment/owner.py)
    # the transformers release the code's own reads chose (agents/environment/release_choice.py): the hint,
    # the release chosen, every release examined and what it lacked
    release_choice: dict[str, Any] | None = None
    # installs the model's layer may go without when the index cannot install them (requirement -> why: a
    # distribution guessed from an import, a pin the code imports only in a function or under a guard); each is then a
    # note
    spare: dict[str, str] = field(default_factory=dict)
    # releases a run of this port failed on with a missing name ("4.36" -> the error; release_retry.py)
    release_rejected: dict[str, str] = field(default_factory=dict)
    release_extra: list[list[Any]] = field(default_factory=list)  # [paths, where] of the reads those runs named

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
            # an era's env is reconciled with the host packages it shadows (agents/environment/era.py)
            **({"era_layout": 3} if self.era else {}),
            **({"era_base": self.era_base} if self.era_base else {}),
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
            "era_base": self.era_base, "owner": self.owner or None, "summary": self.summary(),
            "era": self.era, "release_choice": self.release_choice, "release_rejected": self.release_rejected,
            "release_extra": self.release_extra,
        }


def bundle_files(target: str, stack: dict[str, str | None], pins: dict[str, str],
                  compat: dict[str, Any], pair: dict[str, Any] | None = None) -> tuple[str, str]:
    """requirements.txt (what the port needs) and constraints.txt (the versions it was validated
    with) for the bundle. With a torch pair (agents/environment/torch_pair.py), both pin the pair that ran."""
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
        exact = exact_version(Requirement(requirement).specifier)
        if exact:
            con_lines.append(f"{name}=={exact}")
    return "\n".join(req_lines) + "\n", "\n".join(con_lines) + "\n"

