"""A transformers release's API index, asked questions (``ReleaseAPI.provides``), and where the indexes
come from: one release per minor line, its wheel downloaded once into the wheel cache by the confined pip
(never installed, never imported), indexed once (agents/environment/api_index.py) and kept beside it.

    api = line_api((4, 36), log)             # the newest 4.36.x, indexed (built on first use)
    api.provides("transformers.cache_utils")  # True
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agents.environment.api_index import (
    OPEN,
    ROOT,
    SCHEMA,
    SourceTree,
    api_json,
    build_index,
    parse_module,
    write_json,
)

Line = tuple[int, int]
Log = Callable[[str], None]
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


def _silent(_: str) -> None:
    pass


class ReleaseAPI:
    """The index of one release, read from its JSON; a model's module not read yet is read from the wheel
    when a question needs it (and kept)."""

    def __init__(self, doc: dict[str, Any], path: Path | None, tree: Path | None) -> None:
        self.doc, self.path, self.tree = doc, path, tree
        self.version: str = doc["version"]
        self._names: dict[str, dict[str, str]] = {}
        self._grew = False

    @property
    def line(self) -> Line:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    def is_module(self, module: str) -> bool:
        return module in self.doc["modules"] or module in self.doc["aliases"]

    def _parsed(self, module: str) -> dict[str, Any] | None:
        module = self.doc["aliases"].get(module, module)
        found = self.doc["parsed"].get(module)
        if found is not None or module not in self.doc["modules"]:
            return found
        if self.tree is None:
            self.tree = _download(self.version, _silent, 300.0)  # the cache lost the wheel: fetch it again
        if self.tree is None:
            return None
        rel = self.doc["modules"][module]
        tree = SourceTree(self.tree)
        try:
            api = parse_module(module, rel.endswith("__init__.py"), tree.read(rel))
        except (KeyError, OSError):
            return None
        finally:
            tree.close()
        found = api_json(api)
        self.doc["parsed"][module] = found
        if api.all is not None:
            self.doc["exports"][module] = api.all
        self._grew = True
        return found

    def names_of(self, module: str, seen: frozenset[str] = frozenset()) -> dict[str, str]:
        """name -> origin ("" when defined there) of every name ``from module import name`` finds: its own,
        those its star imports bring (a module's ``__all__``, else its public names), its submodules."""
        if module in self._names:
            return self._names[module]
        real = self.doc["aliases"].get(module, module)
        parsed = self._parsed(real) or {"names": {}, "stars": []}
        out: dict[str, str] = {n: (o or f"{real}.{n}") for n, o in parsed["names"].items()}
        for star in parsed["stars"]:
            if star in seen or not self.is_module(star):
                continue
            exported = self.doc["exports"].get(self.doc["aliases"].get(star, star))
            if exported is not None:  # its __all__, read without parsing it
                for name in exported:
                    out.setdefault(name, f"{star}.{name}")
                continue
            theirs = self.names_of(star, seen | {module})
            for name in (n for n in theirs if not n.startswith("_")):
                out.setdefault(name, theirs[name])
        prefix = f"{real}."
        for child in self.doc["modules"]:
            if child.startswith(prefix) and "." not in child[len(prefix):]:
                out.setdefault(child[len(prefix):], child)
        self._names[module] = out
        return out

    def provides(self, path: str) -> bool:
        """Whether the dotted path resolves in this release: a module, a name in it, a member of a class (its
        own or inherited from a transformers base). Attributes of what is not a transformers class (a
        function, a value, an outside class) are not checked further."""
        if path in self.doc["patched"]:
            return True
        return self._resolve(path.split("."), set())

    def _resolve(self, parts: list[str], seen: set[str]) -> bool:
        key = ".".join(parts)
        if key in seen or parts[0] != ROOT:
            return False
        seen.add(key)
        cut = next((i for i in range(len(parts), 0, -1) if self.is_module(".".join(parts[:i]))), 0)
        if cut == 0:
            return False
        module, rest = ".".join(parts[:cut]), parts[cut:]
        if not rest:
            return True
        names = self.names_of(module)
        origin = names.get(rest[0])
        if origin is None:
            return names.get("__getattr__") == f"{self.doc['aliases'].get(module, module)}.__getattr__"  # PEP 562
        if len(rest) == 1 or not origin.startswith(f"{ROOT}."):
            return True
        real = self.doc["aliases"].get(module, module)
        if origin != f"{real}.{rest[0]}":
            return self._resolve([*origin.split("."), *rest[1:]], seen)  # a re-export: where it is defined
        cls = (self._parsed(real) or {}).get("classes", {}).get(rest[0])
        return True if cls is None else self._member(f"{real}.{rest[0]}", rest[1], set())

    def _class(self, path: str, seen: set[str]) -> tuple[str, dict[str, list[str]]] | None:
        """(defining path, record) of the class ``path`` names, following re-exports."""
        if path in seen:
            return None
        seen.add(path)
        parts = path.split(".")
        cut = next((i for i in range(len(parts) - 1, 0, -1) if self.is_module(".".join(parts[:i]))), 0)
        if cut != len(parts) - 1:
            return None
        module = self.doc["aliases"].get(".".join(parts[:cut]), ".".join(parts[:cut]))
        record = (self._parsed(module) or {}).get("classes", {}).get(parts[-1])
        if record is not None:
            return f"{module}.{parts[-1]}", record
        origin = self.names_of(module).get(parts[-1])
        return self._class(origin, seen) if origin and origin.startswith(f"{ROOT}.") else None

    def _member(self, class_path: str, attr: str, seen: set[str]) -> bool:
        found = self._class(class_path, set())
        if found is None or found[0] in seen:
            return False
        seen.add(found[0])
        if attr in found[1]["members"] or OPEN in found[1]["members"]:
            return True
        return any(self._member(base, attr, seen) for base in found[1]["bases"] if base.startswith(f"{ROOT}."))

    def save(self) -> None:
        """Keep what questions read (a model's modules) in the index file."""
        if self._grew and self.path is not None:
            write_json(self.path, self.doc)
            self._grew = False


# --- where the indexes come from --------------------------------------------------------------------------

def index_dir() -> Path:
    from knowledge.wheel import wheel_cache_dir

    path = wheel_cache_dir() / "transformers-api"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(name: str) -> Iterator[None]:
    with (index_dir() / f".{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two ports indexing the same release wait for each other
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def line_of(version: str) -> Line | None:
    m = _VERSION.match(version.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def _cached_wheels() -> dict[str, Path]:
    from knowledge.wheel import wheel_cache_dir

    found = {}
    for wheel in wheel_cache_dir().glob(f"{ROOT}-*-py3-none-any.whl"):
        version = wheel.name.split("-")[1]
        if _VERSION.match(version):
            found[version] = wheel
    return found


def release_versions(log: Log = _silent, timeout_s: float = 120.0) -> list[str]:
    """Every final release of transformers the package index offers (``pip index versions``, asked once a
    day and kept beside the indexes); offline, the releases whose wheels are in the cache."""
    import time

    cached = index_dir() / "versions.json"
    if cached.is_file() and time.time() - cached.stat().st_mtime < 86400:
        return list(json.loads(cached.read_text()))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", ROOT, "--disable-pip-version-check"],
                              capture_output=True, text=True, timeout=timeout_s)
        m = re.search(r"Available versions: (.+)", done.stdout)
    except (OSError, subprocess.TimeoutExpired):
        m = None
    if m is None:
        log("the package index did not list transformers releases: the cached wheels stand for them")
        return sorted(_cached_wheels(), key=_key)
    versions = sorted((v.strip() for v in m.group(1).split(",") if _VERSION.match(v.strip())), key=_key)
    write_json(cached, versions)
    return versions


def newest_of_lines(versions: list[str], lowest: Line, highest: Line) -> dict[Line, str]:
    """The newest release of each minor line between ``lowest`` and ``highest`` (both included)."""
    out: dict[Line, str] = {}
    for version in sorted(versions, key=_key):
        line = line_of(version)
        if line is not None and lowest <= line <= highest:
            out[line] = version
    return out


def _download(version: str, log: Log, timeout_s: float) -> Path | None:
    """The release's wheel in the wheel cache, downloaded by the confined pip (no dependencies, no install)."""
    from knowledge.wheel import wheel_cache_dir
    from sandbox.isolation.installs import run_pip

    have = _cached_wheels().get(version)
    if have is not None:
        return have
    scratch = index_dir() / f".download-{version}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log(f"downloading transformers {version} (its wheel, to read its API; never installed)")
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
            "--disable-pip-version-check", "-d", str(scratch), f"{ROOT}=={version}"]
    try:
        run_pip(argv, writable=(scratch,), timeout=timeout_s)
        got = sorted(scratch.glob(f"{ROOT}-{version}-*.whl"))
        if not got:
            return None
        target = wheel_cache_dir() / got[0].name
        shutil.move(str(got[0]), target)
        return target
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def release_api(version: str, log: Log = _silent, timeout_s: float = 300.0,
                installed: Path | None = None) -> ReleaseAPI | None:
    """The index of ``version`` (built from its wheel on first use, then read from the cache); ``installed``:
    the folder holding an installed ``transformers`` of that version, read instead of a wheel. None when the
    index has no wheel of it and none is installed."""
    path = index_dir() / f"{version}.json"
    with _locked(version):
        if path.is_file():
            doc = json.loads(path.read_text())
            if doc.get("schema") == SCHEMA:
                return ReleaseAPI(doc, path, installed or _cached_wheels().get(version))
        source = installed or _download(version, log, timeout_s)
        if source is None:
            return None
        log(f"indexing the API of transformers {version} (once; kept in {index_dir()})")
        tree = SourceTree(source)
        try:
            doc = build_index(version, tree, source.name)
        finally:
            tree.close()
        write_json(path, doc)
    return ReleaseAPI(doc, path, source)


def host_install() -> tuple[str, Path] | None:
    """(version, folder holding the package) of the host's transformers, found without importing it."""
    import importlib.metadata as md

    try:
        dist = md.distribution(ROOT)
    except md.PackageNotFoundError:
        return None
    init = Path(str(dist.locate_file(f"{ROOT}/__init__.py")))
    return (dist.version, init.parent.parent) if init.is_file() else None
