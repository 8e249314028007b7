"""The environment of the model's era: which transformers its authors ran (config.json's
``transformers_version``, or the last 4.x that gives PreTrainedModel generate (4.49) when the config names none and the code is coupled to 4.x,
hazard H18), and keeping the layered env consistent with the host packages it shadows.

A layered env installs only the era's transformers (and what pip pulls with it: tokenizers,
huggingface-hub); host packages that need the host's newer releases (an HF ``kernels`` that imports a
huggingface-hub 1.x name, which transformers 4.x imports when it is installed) are then broken there.
``reconcile`` asks pip which host packages the env broke and installs, into the env, releases of them that
fit (a failure is a note: the host's release stays)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from agents.env_pins import model_py_files
from agents.env_torch import minor_of

# The last 4.x line in which PreTrainedModel itself inherits GenerationMixin (4.50 stopped it): it has
# every name 4.x code imports and gives generate to the generative classes that relied on the inheritance.
LAST_4X = "transformers<4.50"
# pip check: "kernels 0.19.1 has requirement huggingface-hub>=1.32.0, but you have huggingface-hub 0.36.2."
_BROKEN = re.compile(r"^(?P<dist>[\w.-]+) (?P<ver>\S+) has requirement (?P<req>.+?), but you have (?P<have>[\w.-]+) ")


def era_transformers(saved: str | None, host: str | None) -> str | None:
    """The transformers requirement of the model's era: the newest patch of the minor release its
    config.json was saved with (``transformers~=4.36.0``), when the host's is another major release;
    None when the host's release is of the same major (its API is the one the code was written for)."""
    if not saved or not host:
        return None
    try:
        s_major, s_minor = minor_of(saved)
        h_major = minor_of(host)[0]
    except (ValueError, IndexError):
        return None
    if s_major >= h_major or s_major < 4:
        return None  # older than 4.0 (pytorch-transformers) has no wheel for this Python; keep the host's
    return f"transformers~={s_major}.{s_minor}.0"


def model_couplings(model_dir: Path) -> list[str]:
    """The model's version couplings (hazard H18) as "file:line: reason", in file order."""
    from agents.rules.h18_version_couplings import config_class_attrs, couplings

    files = model_py_files(model_dir)
    sources = {p: p.read_text(encoding="utf-8", errors="replace") for p in files}
    attrs = config_class_attrs(list(sources.values()))
    return [f"{p.relative_to(model_dir).as_posix()}:{c.line}: {c.reason}" for p, src in sources.items()
            for c in couplings(src, attrs)]


def own_site_packages(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python*/site-packages"))


def own_versions(python: Path) -> dict[str, str]:
    """{dist: version} installed in the env's own site-packages (not the host's it is layered on)."""
    out = {}
    for info in own_site_packages(python).glob("*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].rpartition("-")
        if name:
            out[name.lower().replace("_", "-")] = version
    return out


def broken_host_packages(python: Path, timeout_s: float = 120.0) -> dict[str, str]:
    """{host dist: why} for the host packages whose requirements the env's own packages break."""
    from sandbox.probe import run_probe  # the env's .pth files run when it starts: inside the sandbox

    done = run_probe([str(python), "-m", "pip", "check", "--disable-pip-version-check"], timeout=timeout_s)
    own = own_versions(python)
    broken: dict[str, str] = {}
    for line in done.stdout.splitlines():
        m = _BROKEN.match(line.strip())
        if m and m["have"].lower().replace("_", "-") in own and m["dist"].lower() not in own \
                and m["dist"].lower() not in ("npuport", "torch", "torch-npu"):
            broken.setdefault(m["dist"], line.strip())
    return broken


def reconcile(python: Path, run_pip: Callable[[Path, list[str], Path, float], subprocess.CompletedProcess[str]],
              keep: list[str], timeout_s: float) -> dict[str, str]:
    """Install into the env releases of the host packages it broke that fit the env's own packages
    (held at their versions). Returns {dist: outcome} for the report and the env's marker."""
    broken = broken_host_packages(python)
    if not broken:
        return {}
    own = own_versions(python)
    constraints = python.parent.parent / "npuport-reconcile-constraints.txt"
    constraints.write_text("\n".join([*keep, *(f"{d}=={v}" for d, v in sorted(own.items()))]) + "\n")
    outcome: dict[str, str] = {}
    for dist, why in sorted(broken.items()):
        done = run_pip(python, [dist], constraints, timeout_s)
        after = own_versions(python).get(dist.lower().replace("_", "-"))
        outcome[dist] = (f"{dist} {after} installed into the env ({why})" if done.returncode == 0 and after else
                         f"left as the host's: no release fits ({why})")
    return outcome
