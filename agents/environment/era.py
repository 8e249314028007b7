"""The environment of the model's era: which transformers its authors ran (config.json's
``transformers_version``, or the last 4.x that gives PreTrainedModel generate (4.49) when the config names none and the
code is coupled to 4.x, hazard H18), and keeping the layered env consistent with the host packages it shadows.

A layered env installs only the era's transformers (and what pip pulls with it: tokenizers,
huggingface-hub); host packages that need the host's newer releases (an HF ``kernels`` that imports a
huggingface-hub 1.x name, which transformers 4.x imports when it is installed) are then broken there.
``reconcile`` asks pip which host packages the env broke and installs, into the env, releases of them that
fit (a failure is a note: the host's release stays)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.environment.pins import model_py_files
from agents.environment.torch_pair import minor_of

# The last 4.x line in which PreTrainedModel itself inherits GenerationMixin (4.50 stopped it): it has
# every name 4.x code imports and gives generate to the generative classes that relied on the inheritance.
LAST_4X = "transformers<4.50"
# pip check: "kernels 0.19.1 has requirement huggingface-hub>=1.32.0, but you have huggingface-hub 0.36.2."
_BROKEN = re.compile(r"^(?P<dist>[\w.-]+) (?P<ver>\S+) has requirement (?P<req>.+?), but you have (?P<have>[\w.-]+) ")


def era_transformers(saved: str | None, host: str | None, floor: str | None = None) -> str | None:
    """The transformers requirement of the model's era: the newest patch of the minor release its
    config.json was saved with (``transformers~=4.36.0``), when the host's is another major release;
    None when the host's release is of the same major (its API is the one the code was written for).
    ``floor``: the oldest line installable on this Python (compat.yaml ``transformers_floor``); an older
    era is lifted to it."""
    if not saved or not host:
        return None
    try:
        s_major, s_minor = minor_of(saved)
        h_major = minor_of(host)[0]
    except (ValueError, IndexError):
        return None
    if s_major >= h_major or s_major < 4:
        return None  # older than 4.0 (pytorch-transformers) has no wheel for this Python; keep the host's
    if floor and (s_major, s_minor) < minor_of(floor):
        s_major, s_minor = minor_of(floor)
    return f"transformers~={s_major}.{s_minor}.0"


def python_floor(compat: dict[str, Any]) -> str | None:
    """The oldest transformers line whose dependencies have wheels for this Python (compat.yaml)."""
    floors: dict[str, str] = compat.get("transformers_floor") or {}
    return floors.get(f"{sys.version_info.major}.{sys.version_info.minor}")


def era_ceiling(model_dir: Path) -> tuple[str, str] | None:
    """(release, "file:line: reason") of the earliest transformers release the model's code breaks with
    below 5 (a coupling such as a composite config 4.45's generate cannot build): the era stays below it."""
    from agents.rules.h18_version_couplings import config_class_attrs, couplings

    files = model_py_files(model_dir)
    sources = {p: p.read_text(encoding="utf-8", errors="replace") for p in files}
    attrs = config_class_attrs(list(sources.values()))
    bounded = [(minor_of(c.before), c.before, f"{p.relative_to(model_dir).as_posix()}:{c.line}: {c.reason}")
               for p, src in sources.items() for c in couplings(src, attrs) if minor_of(c.before)[0] < 5]
    if not bounded:
        return None
    _, before, where = min(bounded)
    return before, where


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
    from sandbox.isolation.probe import (
        run_probe,  # the env's .pth files run when it starts: inside the sandbox
    )

    done = run_probe([str(python), "-m", "pip", "check", "--disable-pip-version-check"], timeout=timeout_s)
    own = own_versions(python)
    broken: dict[str, str] = {}
    for line in done.stdout.splitlines():
        m = _BROKEN.match(line.strip())
        if m and m["have"].lower().replace("_", "-") in own and m["dist"].lower() not in own \
                and m["dist"].lower() not in ("npuport", "torch", "torch-npu"):
            broken.setdefault(m["dist"], line.strip())
    return broken


def _top_modules(dist: str) -> set[str]:
    """The top-level modules a host distribution provides (its top_level.txt, else its files)."""
    import importlib.metadata as md

    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        return {dist.replace("-", "_")}
    top = (d.read_text("top_level.txt") or "").split()
    if top:
        return set(top)
    return {f.parts[0].removesuffix(".py") for f in (d.files or []) if f.parts and not f.parts[0].endswith(
        (".dist-info", ".data", ".pth")) and f.parts[0] != ".."} or {dist.replace("-", "_")}


def imported_by_env(python: Path, dists: list[str]) -> set[str]:
    """The host distributions among ``dists`` whose modules the env's own packages import (an import
    statement anywhere in their sources, at any indentation): the ones a run there can load."""
    wanted = {m: d for d in dists for m in _top_modules(d)}
    if not wanted:
        return set()
    pattern = re.compile(r"^\s*(?:from|import)\s+(" + "|".join(map(re.escape, wanted)) + r")\b", re.M)
    found: set[str] = set()
    site = own_site_packages(python)
    for source in site.rglob("*.py"):
        if source.relative_to(site).parts[0].removesuffix(".py") in wanted:
            continue  # the package's own files (a release the env already holds)
        for m in pattern.finditer(source.read_text(encoding="utf-8", errors="replace")):
            found.add(wanted[m.group(1)])
        if len(found) == len(set(wanted.values())):
            break
    return found


def reconcile(python: Path, run_pip: Callable[[Path, list[str], Path, float], subprocess.CompletedProcess[str]],
              keep: list[str], timeout_s: float) -> dict[str, str]:
    """Install into the env releases of the host packages it broke that fit the env's own packages
    (held at their versions), for the broken packages the env's own packages import (transformers 4.5x
    imports an installed HF ``kernels``; nothing of the era imports sentence-transformers, so a broken one
    stays as it is, unread). Returns {dist: outcome} for the report and the env's marker."""
    broken = broken_host_packages(python)
    if not broken:
        return {}
    used = imported_by_env(python, sorted(broken))
    unused = {d: why for d, why in broken.items() if d not in used}
    broken = {d: why for d, why in broken.items() if d in used}
    if not broken:
        return {d: f"left as the host's: nothing in the env imports it ({why})" for d, why in sorted(unused.items())}
    own = own_versions(python)
    constraints = python.parent.parent / "npuport-reconcile-constraints.txt"
    constraints.write_text("\n".join([*keep, *(f"{d}=={v}" for d, v in sorted(own.items()))]) + "\n")
    outcome: dict[str, str] = {}
    for dist, why in sorted(broken.items()):
        done = run_pip(python, [dist], constraints, timeout_s)
        after = own_versions(python).get(dist.lower().replace("_", "-"))
        if done.returncode != 0 or not after:
            outcome[dist] = f"left as the host's: no release fits ({why})"
            continue
        after, stepped = _importable_release(python, dist, after, run_pip, constraints, timeout_s)
        outcome[dist] = (f"{dist} {after} installed into the env ({why})"
                         + (f"; {stepped}" if stepped else "") if after else
                         f"left as the host's: no release that fits imports ({why}; {stepped})")
    outcome.update({d: f"left as the host's: nothing in the env imports it ({why})" for d, why in unused.items()})
    return outcome


# How many older lines of a reconciled package are tried when the one pip chose does not import.
STEP_DOWN_LINES = 10


def import_error(python: Path, modules: set[str], timeout_s: float = 120.0) -> str | None:
    """The last line of the error importing ``modules`` in the env, or None when they import."""
    from sandbox.isolation.probe import run_probe

    code = "; ".join(f"import {m}" for m in sorted(modules))
    done = run_probe([str(python), "-c", code], timeout=timeout_s)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def _importable_release(python: Path, dist: str, version: str,
                        run_pip: Callable[[Path, list[str], Path, float], subprocess.CompletedProcess[str]],
                        constraints: Path, timeout_s: float) -> tuple[str | None, str]:
    """(the release of ``dist`` left in the env that imports, what was stepped over). A release's metadata
    may ask less than its code imports (accelerate 0.32 declares any huggingface-hub and imports a name of
    0.23): pip's choice is imported, and while it fails the newest release of the line below is tried."""
    modules = {m for m in _top_modules(dist) if m.isidentifier()}
    if not modules:
        return version, ""
    failed: list[str] = []
    for _ in range(STEP_DOWN_LINES):
        error = import_error(python, modules)
        if error is None:
            return version, (f"newer releases fit pip's resolver but fail to import: {'; '.join(failed)}"
                             if failed else "")
        failed.append(f"{version}: {error[:160]}")
        try:
            major, minor = minor_of(version)
        except (ValueError, IndexError):
            break
        if (major, minor) == (0, 0):
            break
        below = f"{major}.{minor}" if minor else f"{major}"
        done = run_pip(python, [f"{dist}<{below}"], constraints, timeout_s)
        now = own_versions(python).get(dist.lower().replace("_", "-"))
        if done.returncode != 0 or not now or now == version:
            break
        version = now
    return None, "; ".join(failed)
