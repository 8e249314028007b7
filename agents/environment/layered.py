"""The layered sandbox environment: a venv made for a resolution, layered on the host (or on a torch pair's
base env), installing only what the host does not satisfy; built once, cached by what it holds, locked
against concurrent builds. ``ensure_env`` also chooses and proves the torch pair and records what pip
reconciled (the era's release itself is chosen by resolve: agents/environment/release_choice.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from agents.environment.compat import (
    FRAMEWORK,
    NPU_TARGETS,
    NPUPORT_ROOT,
    host_site_dirs,
    host_version,
    load_compat,
    torch_npu_row,
)
from agents.environment.era import own_versions, reconcile
from agents.environment.owner import env_owner, provenance
from agents.environment.resolution import Resolution, bundle_files
from agents.environment.torch_pair import COMPANIONS, TorchPair, choose_pair, probe
from agents.environment.torch_pair import release_of as _release
from knowledge.disk import low_disk_note
from knowledge.errors import EnvBuildError, first_line

MARKER = "npuport-env.json"


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
def locked(path: Path) -> Iterator[None]:
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
    own_site = purelib(env_python(env_dir))
    sites = [*_base_sites(resolution), *host_site_dirs()]
    pth = Path(own_site) / "_npuport_layer.pth"
    pth.write_text(
        f"import site; list(map(site.addsitedir, {sites!r}))\n"
        f"{NPUPORT_ROOT}\n"
    )
    return pth


def purelib(python: Path) -> str:
    # -S: no .pth of the env runs outside the sandbox. Without site, sys.prefix is the base interpreter's,
    # so the env's own prefix (python's bin/..) is passed in.
    # The venv scheme by name: without site, Debian's Python would answer with its posix_local scheme
    # (local/lib/.../dist-packages), which is not where venv put the env's packages.
    code = ("import sys, sysconfig; s = 'venv' if 'venv' in sysconfig.get_scheme_names() else 'posix_prefix'; "
            "print(sysconfig.get_paths(s, vars={'base': sys.argv[1], 'platbase': sys.argv[1]})['purelib'])")
    return subprocess.run([str(python), "-I", "-S", "-c", code, str(Path(python).parent.parent)],
                          capture_output=True, text=True, check=True).stdout.strip()


def _base_sites(resolution: Resolution) -> list[str]:
    """Site dirs of the envs a layered env sits on, nearest first: the era's base env (agents/environment/
    era.py; its own .pth adds the torch pair's base and the host after it), else the torch pair's base env."""
    if resolution.era_base:
        return [purelib(env_python(Path(resolution.era_base)))]
    base = (resolution.torch_pair or {}).get("base_env")
    return [purelib(env_python(Path(base)))] if base else []


def _layers(resolution: Resolution) -> list[str]:
    """Folders an env reads besides its own (the sandbox binds them read-only: sandbox/isolation/bwrap.py)."""
    bases = [resolution.era_base, (resolution.torch_pair or {}).get("base_env")]
    return [str(Path(b).resolve()) for b in bases if b]


def own_installs(resolution: Resolution) -> list[str]:
    """What the model's own layer installs: its pins beyond what the era's base env holds."""
    if not resolution.era_base:
        return list(resolution.install)
    return [r for r in resolution.install if r not in resolution.era_installs]


def run_pip(python: Path, install: list[str], constraints: Path, timeout_s: float,
            layers: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    # Wheels only (no setup.py), and in the sandbox: the env's interpreter runs the .pth files of the wheels
    # installed before; only the env folder is writable, the network reaches only the index
    # (sandbox/isolation/installs.py). ``layers``, the envs this one sits on, are bound read-only: NPUPORT_HOME is
    # masked in the sandbox, and a pip that cannot see the torch pair's base env installs torch (5 GB with its CUDA
    # wheels) into every layer.
    from sandbox.isolation.installs import run_pip as confined_pip

    argv = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--only-binary=:all:",
            "-c", str(constraints), *install]
    return confined_pip(argv, writable=(Path(python).parent.parent,), readable=layers, timeout=timeout_s)


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
    resolution.requirements_txt, resolution.constraints_txt = bundle_files(
        resolution.target, resolution.stack, resolution.pins, load_compat(), resolution.torch_pair)


def _stack_torch_npu_torch(resolution: Resolution) -> str | None:
    row = torch_npu_row(resolution.torch_npu, load_compat()) if resolution.torch_npu else None
    return row["torch"] if row else None


def ensure_env(resolution: Resolution, cache_root: Path | None = None, timeout_s: float = 900.0,
               log: Callable[[str], None] | None = None) -> Path | None:
    """The python of the layered venv for ``resolution`` (built once, then reused), or None when the
    host already satisfies every pin. When the model imports torchvision / torchaudio, the torch pair is
    chosen and proven first (agents/environment/torch_pair.py) and recorded in the resolution. Raises EnvBuildError
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
    python = _ensure_model_env(resolution, root, timeout_s, log)
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
            python = _ensure_model_env(resolution, root, timeout_s, log)
    era_python = env_python(Path(resolution.era_base)) if resolution.era_base else python
    if resolution.era and (installed := own_versions(era_python).get("transformers")):
        resolution.stack["transformers"] = installed  # the release pip chose for the era's range
    marker = json.loads((era_python.parent.parent / MARKER).read_text())
    for dist, outcome in (marker.get("reconciled") or {}).items():
        resolution.notes.append(f"host package {dist} needs newer releases than the era's: {outcome}.")
    own = json.loads((python.parent.parent / MARKER).read_text()) if (python.parent.parent / MARKER).is_file() else {}
    for req, why in (own.get("left_out") or {}).items():
        resolution.notes.append(f"{req} is left out of the environment: the package index cannot install it ({why}); "
                                f"it is {resolution.spare.get(req, 'not one the code needs to load')}, so "
                                "the port goes on without it (a run that needs it fails on its import).")
        resolution.dropped[str(Requirement(req).name)] = f"left out: the package index cannot install it ({why})"
    return python


def _ensure_model_env(resolution: Resolution, root: Path, timeout_s: float, log: Callable[[str], None]) -> Path:
    """The model's env: for a model of an era, its own layer on the era's base env (built once per era and
    shared by every port of it), or the base env itself when the model installs nothing of its own."""
    resolution.era_base = None
    if not resolution.era:
        return _ensure_layered(resolution, root, timeout_s, log)
    base = dataclasses.replace(resolution, install=list(resolution.era_installs), optional=[], notes=[],
                               era_base=None)
    base_python = _ensure_layered(base, root, timeout_s, log, what=f"the environment of the era {resolution.era}")
    resolution.era_base = str(base_python.parent.parent)
    if not own_installs(resolution) and not resolution.optional:
        return base_python
    return _ensure_layered(resolution, root, timeout_s, log)


def _ensure_layered(resolution: Resolution, root: Path, timeout_s: float, log: Callable[[str], None],
                    what: str = "the model's layered environment") -> Path:
    resolution.owner = env_owner(resolution)  # the owner is part of the key: set before the key is read
    env_dir = root / resolution.env_key
    with locked(root / f"{resolution.env_key}.lock"):
        if (env_dir / MARKER).is_file() and env_python(env_dir).exists():
            return env_python(env_dir)
        shutil.rmtree(env_dir, ignore_errors=True)  # a build that died half way
        if own_installs(resolution):
            log(f"building {what} ({', '.join(own_installs(resolution))}) in {env_dir}")
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
    pip = functools.partial(run_pip, layers=tuple(Path(p) for p in _layers(resolution)))
    start = time.monotonic()
    install = own_installs(resolution)
    left_out: dict[str, str] = {}
    if install:
        try:
            done = pip(env_python(env_dir), install, constraints, timeout_s)
            spare = [r for r in install if r in resolution.spare] if done.returncode != 0 else []
            if spare:
                done, left_out = _install_without(env_dir, install, spare, constraints, timeout_s, pip)
        except subprocess.TimeoutExpired as exc:
            raise EnvBuildError(f"installing {', '.join(install)} into the layered environment took "
                                f"longer than {timeout_s:g} s and was stopped") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-8:])
            if low := low_disk_note(env_dir):  # pip on a full disk says little of it
                raise EnvBuildError(f"could not install {', '.join(install)} into the layered environment at "
                                    f"{env_dir} (pip exit {done.returncode}): {low}; free some and resume:\n{tail}")
            raise EnvBuildError(
                f"could not install {', '.join(install)} into the layered environment at {env_dir} "
                f"(pip exit {done.returncode}); the model's pins may not exist for Python "
                f"{sys.version_info.major}.{sys.version_info.minor}, may need torch other than the host's, or the "
                f"package registry may be unreachable:\n{tail}"
            )
    optional_failed = _install_optional(env_dir, resolution, constraints, timeout_s, pip)
    # the era's base env reconciles the host packages the era's release breaks (a model's layer on it does not)
    reconciled = reconcile(env_python(env_dir), pip, keep, timeout_s) if resolution.era and \
        not resolution.era_base else {}
    (env_dir / MARKER).write_text(json.dumps({
        "key": resolution.env_key, "install": install, "optional": resolution.optional,
        "optional_failed": optional_failed, "left_out": left_out, "reconciled": reconciled,
        "host_python": resolution.host_python,
        "host_sites": host_site_dirs(), "npuport_root": str(NPUPORT_ROOT),
        "built_s": round(time.monotonic() - start, 1), "model_dir": str(resolution.model_dir),
        "torch_pair": resolution.torch_pair,
        "owner": resolution.owner or None, "provenance": provenance(resolution),  # agents/environment/owner.py
        # Folders the env reads besides its own (the sandbox binds them read-only: sandbox/isolation/bwrap.py).
        "layers": _layers(resolution),
    }, indent=1))


def _install_without(env_dir: Path, install: list[str], spare: list[str], constraints: Path, timeout_s: float,
                     pip: Callable[..., subprocess.CompletedProcess[str]]
                     ) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """The installs failed together: what the code needs, then each spare one on its own (a guessed name the
    index does not have, a pin the code imports only on a path); {requirement: pip's last line} for those
    left out. The first result is that of the needed ones (a failure there fails the env as before)."""
    needed = [r for r in install if r not in spare]
    done = pip(env_python(env_dir), needed, constraints, timeout_s) if needed else \
        subprocess.CompletedProcess([], 0, "", "")
    left_out: dict[str, str] = {}
    if done.returncode != 0:
        return done, left_out
    for req in spare:
        alone = pip(env_python(env_dir), [req], constraints, timeout_s)
        if alone.returncode != 0:
            left_out[req] = ((alone.stderr or alone.stdout).strip().splitlines() or ["pip failed"])[-1][:300]
            _stderr_log(f"{req} left out of the environment (the package index cannot install it): {left_out[req]}")
    return done, left_out


def _install_optional(env_dir: Path, resolution: Resolution, constraints: Path, timeout_s: float,
                      pip: Callable[..., subprocess.CompletedProcess[str]]) -> dict[str, str]:
    """Install each guarded import's package on its own; {package: why not} for those the index lacks."""
    failed: dict[str, str] = {}
    for req in resolution.optional:
        try:
            done = pip(env_python(env_dir), [req], constraints, timeout_s)
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
    from knowledge.errors import NativeUnavailable
    from sandbox.ascend_sim.native_build import choose_engine
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
