"""The compatibility table (agents/data/compat.yaml) and what the host has: torch_npu rows, torch
companions, CUDA-only packages, installed distributions, site dirs and the installed CANN."""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import re
import site
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet

from agents.environment.torch_pair import minor_of as _minor
from agents.environment.torch_pair import release_of as _release
from sandbox.targets import TARGETS

COMPAT_PATH = Path(__file__).resolve().parents[1] / "data" / "compat.yaml"
NPUPORT_ROOT = Path(__file__).resolve().parents[2]  # holds agents/, sandbox/, ... (goes on the env's path)
NPU_TARGETS = tuple(name for name, spec in TARGETS.items() if spec.npu_like)  # the target registry says

# The target decides these; a layered env never installs them (they come with the host or the NPU stack).
FRAMEWORK = {"torch", "torchvision", "torchaudio", "torch-npu", "vllm", "vllm-ascend", "triton-ascend"}


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




def cuda_only_reason(name: str, compat: dict[str, Any]) -> str | None:
    for pattern, reason in compat.get("cuda_only", {}).items():
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return str(reason)
    return None


def exact_version(spec: SpecifierSet) -> str | None:
    """The version an exact pin names ('4.46.3' for '==4.46.3'), None otherwise."""
    return next((s.version for s in spec if s.operator in ("==", "===") and "*" not in s.version), None)

