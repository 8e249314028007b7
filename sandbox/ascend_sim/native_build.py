"""Build (once) and locate the ascend-sim native engine: sandbox/ascend_sim/native/ascend_sim_native.cpp.

The library is compiled against the torch in this environment with torch.utils.cpp_extension (a C++
compiler and ninja are needed) in a child process, so the caller's process never loads it, and cached
per source + torch + Python in NPUPORT_NATIVE_CACHE (default ~/.cache/npuport/ascend-sim-native).
The build itself runs confined (sandbox/isolation/installs.py ``run_build``: the host read-only, only the build
folder writable, no network, a scrubbed environment), since the interpreter of a layered env runs the
.pth files of the model's wheels. Targets pass the built path to the model's runs, which only load it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from knowledge.errors import NativeUnavailable, first_line

SOURCE = Path(__file__).resolve().parent / "native" / "ascend_sim_native.cpp"
BUILD_TIMEOUT_S = 900

_BUILD = """
import sys
from torch.utils.cpp_extension import load
name, source, build_dir = sys.argv[1:4]
load(name=name, sources=[source], build_directory=build_dir, extra_cflags=["-O2"], verbose=True)
"""


def cache_root() -> Path:
    from knowledge.settings import settings

    configured = settings().native_cache
    if configured is not None:
        return configured.expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "npuport" / "ascend-sim-native"


_TORCH_ID = ("import sys, torch; print(torch.__version__, int(torch._C._GLIBCXX_USE_CXX11_ABI), "
             "sys.version.replace(chr(10), ' '), sep='|')")


@functools.lru_cache(maxsize=8)
def _torch_identity(python: str | None) -> tuple[str, ...]:
    """torch version, C++ ABI and Python of ``python`` (this interpreter when None): a library built
    for one torch does not load into another (a torch pair's env runs its own torch)."""
    host = importlib.metadata.version("torch"), sys.version
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return host
    # Importing a CUDA torch build to ask its version takes seconds to a minute: remembered per env build
    # (its marker file's mtime changes when the env is rebuilt).
    marker = Path(python).parent.parent / "npuport-env.json"
    memo_key = f"{os.path.abspath(python)}|{marker.stat().st_mtime if marker.is_file() else 'none'}"
    memo = cache_root() / "torch-identities.json"
    try:
        known = json.loads(memo.read_text()) if memo.is_file() else {}
    except (OSError, ValueError):
        known = {}
    line = known.get(memo_key) if marker.is_file() else None
    if not line:
        from sandbox.isolation.probe import (
            run_probe,  # the env's .pth files run when it starts: inside the sandbox
        )

        done = run_probe([python, "-c", _TORCH_ID], timeout=300)
        if done.returncode != 0:
            raise NativeUnavailable(f"{python} cannot import torch: {done.stderr.strip()[-300:]}")
        line = done.stdout.strip().splitlines()[-1]
        if marker.is_file():
            with contextlib.suppress(OSError):
                memo.parent.mkdir(parents=True, exist_ok=True)
                memo.write_text(json.dumps({**known, memo_key: line}, indent=1))
    version, abi, py = str(line).split("|", 2)
    # A layered env over the host's own torch shares the host's build.
    return host if (version, py) == (host[0], sys.version.replace("\n", " ")) else (version, f"cxx11abi={abi}", py)


def build_key(python: str | None = None) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (*_torch_identity(python), platform.machine()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def module_name(key: str) -> str:
    return f"ascend_sim_native_{key}"


def cached_library(python: str | None = None) -> Path | None:
    key = build_key(python)
    so = cache_root() / key / f"{module_name(key)}.so"
    return so if so.is_file() else None


def library_path(*, build: bool = True, log: Callable[[str], None] | None = None, python: str | None = None) -> Path:
    """The compiled engine for the torch of ``python`` (this interpreter when None); builds it when
    missing (under a minute on 2 cores)."""
    found = cached_library(python)
    if found is not None:
        return found
    if not build:
        raise NativeUnavailable("the native engine is not built yet")
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise NativeUnavailable(f"no C++ compiler ({cxx}) on PATH")
    key = build_key(python)
    build_dir = cache_root() / key
    build_dir.mkdir(parents=True, exist_ok=True)
    if log is not None:
        log(f"building the ascend-sim native engine once for this torch (about a minute) in {build_dir}")
    # ninja from the environment's bin dir (the `ninja` wheel) when it is not on PATH.
    builder = python or sys.executable
    env = {"PATH": os.pathsep.join([str(Path(builder).parent), str(Path(sys.executable).parent),
                                    os.environ.get("PATH", "")]),
           "MAX_JOBS": os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1),
           **{k: os.environ[k] for k in ("CXX", "CC") if os.environ.get(k)}}
    # In the sandbox (sandbox/isolation/installs.py): an env's interpreter runs the .pth files of the model's wheels, so
    # the build sees the host read-only, a scrubbed environment, no network, and writes its folder only.
    from sandbox.isolation.installs import run_build

    try:
        r = run_build([builder, "-c", _BUILD, module_name(key), str(SOURCE), str(build_dir)],
                      writable=(build_dir,), timeout=BUILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as e:
        raise NativeUnavailable(f"building the native engine took over {BUILD_TIMEOUT_S} s") from e
    so = build_dir / f"{module_name(key)}.so"
    if r.returncode != 0 or not so.is_file():
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        raise NativeUnavailable(f"building the native engine failed:\n{tail}")
    return so


def choose_engine(requested: str, *, log: Callable[[str], None] | None = None,
                  python: str | None = None) -> tuple[str, str | None, str]:
    """("native"|"python", library path or None, why) for NPUPORT_SIM_ENGINE-style requests, for the
    torch of ``python`` (the interpreter that will run the sandbox; this one when None)."""
    if requested not in ("auto", "native", "python"):
        raise ValueError(f"unknown ascend-sim engine {requested!r}; choose auto, native or python")
    if requested == "python":
        return "python", None, "python engine requested"
    try:
        lib = library_path(log=log, python=python)
    except NativeUnavailable as e:
        if requested == "native":
            raise
        return "python", None, f"native engine unavailable ({first_line(e)}); python engine, slower"
    return "native", str(lib), "native engine (C++ PrivateUse1 backend)"
