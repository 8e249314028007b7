"""Environment resolution: which torch / torch_npu / CANN / vLLM / vllm-ascend / transformers a port
runs on, what the model itself pins, where those disagree (in plain words), and what the sandbox
environment installs to honour the model's pins without touching the host's (agents/environment/
layered.py builds it).

    res = resolve(model_dir, EMULATED_TARGET, DEFAULT_TORCH_NPU)
    python = ensure_env(res) or Path(sys.executable)   # agents.environment.layered: run the harness with this
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from agents.environment.compat import (
    FRAMEWORK,
    cuda_only_reason,
    exact_version,
    host_version,
    load_compat,
)
from agents.environment.era import LAST_4X, era_ceiling, era_transformers, model_couplings, python_floor
from agents.environment.imports import LIGHTER_DIST, function_imports, guarded_imports
from agents.environment.pins import (
    IMPORT_TO_DIST,
    Pin,
    find_pins,
    model_py_files,
    saved_transformers_version,
    unconditional_imports,
)
from agents.environment.release_choice import ReleaseChoice, RunRejections, era_for_code
from agents.environment.resolution import Resolution, bundle_files
from agents.environment.stack import framework_conflict, merge_pins, resolve_vllm, stack_for_target
from agents.environment.torch_pair import COMPANIONS
from agents.environment.torch_pair import minor_of as _minor


def resolve(model_dir: Path, target: str, torch_npu: str | None, runs: RunRejections | None = None) -> Resolution:
    """Resolve the environment a port of ``model_dir`` runs in for ``target`` (cpu | ascend-sim | npu
    | auto) on ``torch_npu`` (a torch_npu release such as "2.13.0"); ``runs``: releases earlier runs of
    the port failed on with a missing name (agents/environment/release_retry.py)."""
    model_dir = Path(model_dir).resolve()
    compat = load_compat()
    conflicts: list[str] = []
    notes: list[str] = []
    stack = stack_for_target(target, torch_npu, compat, conflicts, notes)
    found = find_pins(model_dir)
    by_name: dict[str, list[Pin]] = {}
    for pin in found:
        by_name.setdefault(pin.name, []).append(pin)
    merged = {name: merge_pins(name, pins, conflicts) for name, pins in by_name.items()}
    chosen = _ModelPins()
    for name, (spec, lead) in sorted(merged.items()):
        _take_pin(name, spec, lead, chosen, stack, target, compat, conflicts, notes)
    resolve_vllm(merged, stack, compat, conflicts, notes)
    pins, dropped, install, companions = chosen.pins, chosen.dropped, chosen.install, chosen.companions

    host_tf = host_version("transformers")
    era, last, choice = _era(model_dir, pins, host_tf, compat, notes, runs)
    era_installs = [era] if era else []
    if era:
        pins["transformers"] = era
        install.append(era)
    if era and "einops" not in pins and host_version("einops") is None:
        # transformers 4.x on an Ascend host (torch_npu importable) imports its NPU flash-attention
        # integration, which imports einops unconditionally; it comes with the era's base env on every target,
        # so one base env serves the ports of that era whatever their target
        pins["einops"] = "einops"
        install.append("einops")
        era_installs = [era, "einops"]
        notes.append(f"{era} imports einops on an Ascend target (transformers.integrations.npu_flash_attention): "
                     "einops is installed with it into the era's base environment (for every target, so one base "
                     "env serves them all).")
    guessed = _imported_dependencies(model_dir, pins, dropped, install, notes, compat, stack, companions)
    optional = _guarded_dependencies(model_dir, pins, dropped, notes, compat)
    spare = {**_spare_pins(model_dir, install, found), **guessed}
    tf_exact = (exact_version(SpecifierSet(str(Requirement(pins["transformers"]).specifier)))
                if "transformers" in pins else None)
    # an era's range (transformers~=4.36.0) is shown as it is: pip picks its newest patch when the env is built
    stack["transformers"] = tf_exact or (str(Requirement(era).specifier) if era else host_tf)

    requirements_txt, constraints_txt = bundle_files(target, stack, pins, compat)
    return Resolution(
        model_dir=model_dir, target=target, torch_npu=stack.get("torch_npu"), stack=stack, pins=pins,
        found=found, conflicts=conflicts, notes=notes, dropped=dropped, install=install,
        requirements_txt=requirements_txt, constraints_txt=constraints_txt,
        needs_layered_env=bool(install) or bool(companions) or bool(optional), companions=sorted(set(companions)),
        optional=optional, era=era, era_installs=era_installs, era_last=last if era else None,
        release_choice=choice.as_dict() if choice else None, spare=spare,
        release_rejected={f"{k[0]}.{k[1]}": v for k, v in (runs.rejected if runs else {}).items()},
        release_extra=[[list(n.paths), n.where] for n in (runs.extra if runs else ())],
    )


@dataclass
class _ModelPins:
    """What the model's own pins come to: pinned, left out (and why), installed, torch companions."""

    pins: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    install: list[str] = field(default_factory=list)
    companions: list[str] = field(default_factory=list)


def _take_pin(name: str, spec: SpecifierSet, lead: Pin, chosen: _ModelPins, stack: dict[str, Any], target: str,
              compat: dict[str, Any], conflicts: list[str], notes: list[str]) -> None:
    """One of the model's pins: left out when CUDA-only or decided by the target, else pinned (and installed
    into the layered environment when the host's release does not satisfy it)."""
    req = Requirement(lead.requirement)
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    requirement = f"{name}{extras}{spec}"
    cuda = cuda_only_reason(name, compat)
    if cuda:
        chosen.dropped[name] = f"CUDA-only ({cuda})"
        conflicts.append(f"the model needs {lead.requirement} ({lead.source}), which is CUDA-only ({cuda}) and "
                         "cannot run on Ascend; it is left out and the port removes or replaces its uses (H3).")
        return
    if name in FRAMEWORK:
        problem = framework_conflict(name, spec, lead, stack, target, compat)
        if problem:
            conflicts.append(problem)
        chosen.dropped[name] = "decided by the target (never installed into the sandbox env)"
        if name in COMPANIONS:
            chosen.dropped[name] = "paired with the torch the port runs on (chosen and proven when the env is built)"
            chosen.companions.append(name)
        return
    chosen.pins[name] = requirement
    have = host_version(name)
    if have is None or (spec and not spec.contains(have, prereleases=True)):
        chosen.install.append(requirement)
        host = f"the host has {have}" if have else "the host does not have it"
        notes.append(f"{requirement} ({lead.source}): {host}; installed into the layered environment.")


def _era(model_dir: Path, pins: dict[str, str], host_tf: str | None, compat: dict[str, Any],
         notes: list[str], runs: RunRejections | None = None) -> tuple[str | None, str, ReleaseChoice | None]:
    """(the transformers requirement of the model's era, or None to keep the host's; the newest 4.x the code
    runs with; the release the code's own reads chose), with notes saying why."""
    saved = saved_transformers_version(model_dir)
    floor = python_floor(compat)
    era = era_transformers(saved, host_tf, floor) if "transformers" not in pins else None
    coupled = model_couplings(model_dir) if host_tf and _minor(host_tf)[0] >= 5 else []
    ceiling = era_ceiling(model_dir) if coupled else None
    # the newest 4.x the code runs with: below a coupling's release when that is older than the last 4.x that
    # gives PreTrainedModel generate (a ceiling past it, 4.54's cache default, still runs on the last 4.x)
    capped = ceiling is not None and _minor(ceiling[0]) < _minor(LAST_4X.removeprefix("transformers<"))
    last = f"transformers<{ceiling[0]}" if ceiling and capped else LAST_4X
    if coupled and "transformers" not in pins and not era and not (saved and _minor(saved)[0] >= 5):
        # config.json names no era, but the code is coupled to 4.x: the last 4.x release it runs with
        era = last
        if ceiling and capped:
            notes.append(f"the code needs a release older than {LAST_4X.removeprefix('transformers')} "
                         f"({ceiling[1]}): its era is {era}.")
    elif era and ceiling and _minor(str(Requirement(era).specifier).lstrip("~=<>"))[:2] >= _minor(ceiling[0]):
        notes.append(f"config.json's release is at or past {ceiling[0]}, which the code breaks with ({ceiling[1]}): "
                     f"it runs with {last}.")
        era = last
    if era and saved and floor and era.startswith("transformers~=") and _minor(saved) < _minor(floor):
        notes.append(f"transformers {saved} (config.json) has no wheels for Python {sys.version_info.major}."
                     f"{sys.version_info.minor} (its tokenizers does not), so the oldest line that has, {floor}, "
                     "stands in for it.")
    choice, chose = None, None
    if "transformers" not in pins and host_tf:
        before = era
        era, choice, chose = era_for_code(model_dir, era, last, host_tf, floor, runs, log=_stderr_log, saved=saved)
        if chose:
            notes.append(chose)
        chose = chose if era != before else None
    if era:
        notes.append(_era_note(era, saved, host_tf, coupled, chose))
    elif saved and host_tf and not chose:
        notes.append(f"config.json was saved with transformers {saved} and the host has {host_tf} (same major "
                     "release): the host's transformers is kept.")
    return era, last, choice


def _stderr_log(msg: str) -> None:
    print(f"npuport: {msg}", file=sys.stderr, flush=True)


def _era_note(era: str, saved: str | None, host_tf: str | None, coupled: list[str], chose: str | None) -> str:
    # The release the authors ran: code written for 4.x runs under 5.x as long as every name it
    # imports exists, then breaks at run time (no inherited generate, config attributes moved to the
    # generation config, removed helpers). Both the reference and the port run in the era's env.
    if chose:
        why = "the code's own reads of transformers chose it (above)"
    elif saved and era.startswith("transformers~="):
        why = f"config.json was saved with transformers {saved} and the host has {host_tf} (another major release)"
    else:
        why = f"config.json names no transformers release and the code is coupled to 4.x ({coupled[0]})"
    if coupled and saved and era.startswith("transformers~=") and not chose:
        more = f" and {len(coupled) - 1} more" if len(coupled) > 1 else ""
        why += f"; the code is coupled to it ({coupled[0]}{more})"
    return (f"{why}: the original and the port run in the environment of the model's era, {era}, built "
            f"once from the package index and shared by every port of that era.")


def _guarded_dependencies(model_dir: Path, pins: dict[str, str], dropped: dict[str, str], notes: list[str],
                          compat: dict[str, Any]) -> list[str]:
    """Packages imported inside try/except that the code then requires (agents/environment/imports.py): the host's
    when it has them, else installed into the layered environment when the package index has them (a
    failed install is a note, not a failed build: the import is optional to the code's authors)."""
    from packaging.utils import canonicalize_name

    optional: list[str] = []
    for module, where in sorted(guarded_imports(model_dir, model_py_files(model_dir)).items()):
        dist = str(canonicalize_name(IMPORT_TO_DIST.get(module, module)))
        if dist in pins or dist in dropped or dist in FRAMEWORK or dist in ("torch-npu", "npuport", "sandbox"):
            continue
        cuda = cuda_only_reason(dist, compat)
        if cuda:
            dropped[dist] = (f"CUDA-only ({cuda}); a guarded import the code demands: the port removes or replaces "
                             "its uses (H3)")
            continue
        if host_version(dist) is not None:
            pins[dist] = dist
            continue
        pins[dist] = dist
        optional.append(dist)
        notes.append(f"{module} is imported inside try/except ({where}) and the code demands it: {dist} is "
                     "installed into the layered environment when the package index has it.")
    unconditional = unconditional_imports(model_dir)
    for module, (where, function) in sorted(function_imports(model_dir, model_py_files(model_dir)).items()):
        dist = str(canonicalize_name(LIGHTER_DIST.get(module) or IMPORT_TO_DIST.get(module, module)))
        if module in unconditional or dist in pins or dist in dropped or dist in FRAMEWORK or \
                dist in ("torch-npu", "npuport", "sandbox") or cuda_only_reason(dist, compat):
            continue  # a CUDA-only one is H3's: the port removes or replaces its uses
        if host_version(dist) is not None or (module != dist and host_version(module) is not None):
            continue
        pins[dist] = dist
        optional.append(dist)
        lighter = f" (the CPU build of {module}: a lighter install)" if module in LIGHTER_DIST else ""
        notes.append(f"{module} is imported in the body of {function}() ({where}), unguarded: the function needs it "
                     f"when it runs and transformers' remote-code loader demands it before it loads the file; "
                     f"{dist}{lighter} is installed into the layered environment when the package index has it.")
    return optional


def _imported_dependencies(model_dir: Path, pins: dict[str, str], dropped: dict[str, str], install: list[str],
                           notes: list[str], compat: dict[str, Any], stack: dict[str, str | None],
                           companions: list[str]) -> dict[str, str]:
    """Third-party packages the model's code imports unconditionally that no file pins: the host's
    version when it has one, else installed into the layered environment. torchvision / torchaudio are
    companions of torch: the pair is chosen and proven when the environment is built (agents/environment/torch_pair.py).
    Returns {requirement: why it is a guess} for the distributions named after an import (the index may not
    have one: a module of the model's own the folder does not ship, a package named after its folder)."""
    from packaging.utils import canonicalize_name

    guessed: dict[str, str] = {}
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
        if cuda_only_reason(dist, compat):
            continue  # H3's business: the port removes or replaces its uses
        removed = dropped_module(module, compat)
        if removed is not None:
            # the host's release of the distribution no longer has the module: the newest release that does
            pins[dist] = removed["requirement"]
            install.append(removed["requirement"])
            notes.append(f"{module} is imported by the model ({where}) but the host's {dist} {host_version(dist)} "
                         f"no longer provides it ({removed.get('note', 'removed in a later release')}): "
                         f"{removed['requirement']} is installed into the layered environment.")
            continue
        if host_version(dist) is not None:
            pins[dist] = dist
            continue
        if dist in FRAMEWORK:
            dropped[dist] = "decided by the target (never installed into the sandbox env)"
            continue
        requirement = dist
        pins[dist] = requirement
        install.append(requirement)
        guessed[requirement] = f"a distribution named after `import {module}` ({where})"
        notes.append(f"{module} is imported by the model ({where}) and the host does not have it: {requirement} is "
                     "installed into the layered environment.")
    return guessed


def _spare_pins(model_dir: Path, install: list[str], found: list[Pin]) -> dict[str, str]:
    """{requirement: why} for the model's pins that may be left out when the index cannot install them: the
    code imports them only in a function's body or under a guard, never unguarded at module level (a streaming
    helper one method imports). A pin nothing imports stays required: the user asked for it."""
    from packaging.utils import canonicalize_name

    def dist(module: str) -> str:
        return str(canonicalize_name(IMPORT_TO_DIST.get(module, module)))

    files = model_py_files(model_dir)
    module_level = {dist(m) for m in unconditional_imports(model_dir)}
    on_a_path = {dist(m): where for m, (where, _) in function_imports(model_dir, files).items()}
    on_a_path.update({dist(m): where for m, where in guarded_imports(model_dir, files).items()})
    where = {p.name: p.source for p in found}
    spare = {}
    for requirement in install:
        name = str(canonicalize_name(Requirement(requirement).name))
        if name in where and name in on_a_path and name not in module_level:
            spare[requirement] = (f"pinned ({where[name]}) and imported only on a path of the code "
                                  f"({on_a_path[name]}: in a function or under a guard)")
    return spare


def dropped_module(module: str, compat: dict[str, Any]) -> dict[str, str] | None:
    """compat.yaml's ``removed_modules`` row for a module the host's distribution no longer provides
    (``pkg_resources`` with setuptools >= 82); None when the host can import it or no row names it."""
    import importlib.util

    row = (compat.get("removed_modules") or {}).get(module)
    if not row or host_version(row["dist"]) is None:
        return None
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else dict(row)
