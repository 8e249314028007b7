"""The import surface of the emulated torch_npu: real modules with specs, and package metadata.

Libraries probe for torch_npu the way they probe for any package: `importlib.util.find_spec("torch_npu")`
(transformers, accelerate), `importlib.metadata.version("torch-npu")`, `from torch_npu.contrib import
transfer_to_npu`. A module object dropped into `sys.modules` answers none of these (its `__spec__` is
None, and find_spec raises ValueError on it). So the emulator installs one meta-path finder that is
also its loader and its metadata finder: every module of the surface is imported by the ordinary
import machinery, and `importlib.metadata` finds a `torch-npu` distribution, in this process only.
Nothing is written to the user's environment.

What the finder does not know is left to the rest of `sys.meta_path`; for a submodule of torch_npu that
means `ModuleNotFoundError: No module named 'torch_npu.x'`, and an absent attribute is the plain
`AttributeError: module 'torch_npu' has no attribute 'x'`: the errors a real host gives for an API
its torch_npu build lacks.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

DIST_NAME = "torch-npu"
# Where the modules say they come from: not a file (has_location is False), and it names the emulator.
ORIGIN = "ascend-sim"

Builder = Callable[[types.ModuleType], None]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class SimDistribution(importlib.metadata.Distribution):
    """The `torch-npu` distribution of the emulated host (metadata only, no files)."""

    def __init__(self, version: str) -> None:
        self._version = version

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {DIST_NAME}\n"
                f"Version: {self._version}\n"
                "Summary: NPU bridge for PyTorch (emulated by npuport ascend-sim)\n"
            )
        if filename == "top_level.txt":
            return "torch_npu\n"
        return None

    def locate_file(self, path: Any) -> Any:
        import pathlib

        return pathlib.PurePosixPath(ORIGIN) / str(path)


class SimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds, loads and describes (metadata) the emulated torch_npu modules."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.builders: dict[str, Builder] = {}
        self.packages: set[str] = set()

    def add(self, name: str, builder: Builder, package: bool = False) -> None:
        self.builders[name] = builder
        if package:
            self.packages.add(name)

    # --- importlib.abc.MetaPathFinder ---
    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.builders:
            return None
        is_pkg = fullname in self.packages
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=ORIGIN, is_package=is_pkg)
        if is_pkg:
            spec.submodule_search_locations = []  # no directory: unknown submodules are not found
        return spec

    def invalidate_caches(self) -> None:
        return None

    # --- importlib.abc.Loader ---
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        self.builders[module.__name__](module)

    # --- importlib.metadata (DistributionFinder protocol) ---
    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or _normalize(str(name)) == DIST_NAME:
            yield SimDistribution(self.version)


def finder() -> SimFinder | None:
    for f in sys.meta_path:
        if isinstance(f, SimFinder):
            return f
    return None


def install_finder(version: str, builders: dict[str, tuple[Builder, bool]]) -> SimFinder:
    """Put the finder first on sys.meta_path (ahead of any real torch_npu on sys.path); idempotent."""
    f = finder()
    if f is None:
        f = SimFinder(version)
        sys.meta_path.insert(0, f)
    f.version = version
    for name, (builder, package) in builders.items():
        f.add(name, builder, package)
    importlib.invalidate_caches()
    return f


# Availability probes of libraries (transformers' is_torch_npu_available, accelerate's is_npu_available,
# and the like in peft, diffusers, ...) are cached, some in module constants at import.
_PROBE_FUNC = re.compile(r"is_(torch_)?npu_available")
_PROBE_CONST = re.compile(r"_is_(torch_)?npu_available")


def forget_library_probes() -> list[str]:
    """Drop 'no torch_npu' answers that libraries imported before install() cached.

    A real host never shows that state: torch auto-loads torch_npu at `import torch`, before any library
    can probe. Returns the cleared names (for tests and the curious)."""
    cleared: list[str] = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or mod_name.startswith(("torch", "sandbox")):
            continue
        try:
            names = list(vars(mod))
        except TypeError:
            continue
        for name in names:
            obj = vars(mod).get(name)
            # The name first: getattr on some objects (ctypes libraries) has side effects.
            clear = getattr(obj, "cache_clear", None) if _PROBE_FUNC.fullmatch(name) else None
            if callable(clear):
                clear()
                cleared.append(f"{mod_name}.{name}")
            elif _PROBE_CONST.fullmatch(name) and obj is False:
                setattr(mod, name, True)
                cleared.append(f"{mod_name}.{name}")
    return cleared
