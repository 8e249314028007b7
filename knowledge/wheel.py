"""Get a torch_npu wheel and read it as files, never importing torch_npu.

``import torch_npu`` fails without CANN, and with torch_npu installed even ``import torch``
may fail (backend auto-loading), so everything here reads bytes: a zip member of a wheel, or a
file of an installed distribution found through ``importlib.metadata``.

Three ways to a wheel (``locate_wheel``): an installed ``torch_npu`` distribution, a local
``.whl`` path, or ``pip download`` into a cache (``$NPUPORT_WHEEL_CACHE`` or
``$NPUPORT_HOME/wheels``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from knowledge.errors import WheelDownloadError, WheelError
from knowledge.home import cache_dir
from knowledge.settings import settings

LIB_MEMBER = "torch_npu/lib/libtorch_npu.so"
DOCS_MEMBER = "torch_npu/_op_plugin_docs.py"
VERSION_MEMBER = "torch_npu/version.py"
# The yaml torch_npu's own codegen consumed for this build (op-plugin's yaml, already filtered
# to the build's torch version, plus torch_npu's core ops). Absent from some builds.
CODEGEN_YAML_MEMBER = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"

_CHUNK = 4 << 20  # stream the 100 MB library in 4 MiB pieces
_OVERLAP = 64 << 10  # carried between chunks
_SKIP = 4 << 10  # look-back / look-ahead room around a match (strings are shorter)

# Registry/network failures that mean "offline" rather than "no such wheel".
_UNREACHABLE_HINTS = (
    "Failed to establish a new connection",
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "No route to host",
)


class WheelReader(Protocol):
    """Read-only access to the files of a torch_npu build."""

    origin: str  # a path (wheel or site-packages dir) for provenance

    def has(self, member: str) -> bool: ...

    def open(self, member: str) -> IO[bytes]: ...

    def sha256(self) -> str: ...

    def close(self) -> None: ...


@dataclass
class ZipWheel:
    """A ``.whl`` file, read member by member (zip members decompress as streams)."""

    path: Path
    origin: str = field(init=False)
    _zip: zipfile.ZipFile = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.origin = str(self.path)
        if not self.path.is_file():
            raise WheelError(f"no such wheel file: {self.path}")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError) as e:
            raise WheelError(f"{self.path} is not a wheel (not a readable zip archive: {e})") from e
        if LIB_MEMBER not in self._zip.NameToInfo:
            self._zip.close()
            raise WheelError(f"{self.path} is a zip but not a torch_npu wheel (it has no {LIB_MEMBER})")

    def has(self, member: str) -> bool:
        return member in self._zip.NameToInfo

    def open(self, member: str) -> IO[bytes]:
        try:
            return self._zip.open(member)
        except KeyError as e:
            raise WheelError(f"{self.path} has no member {member}") from e

    def sha256(self) -> str:
        return file_sha256(self.path)

    def close(self) -> None:
        self._zip.close()


@dataclass
class InstalledDist:
    """An installed torch_npu distribution; files located via importlib.metadata, not imported."""

    root: Path  # the directory holding the ``torch_npu`` package
    origin: str = field(init=False)

    def __post_init__(self) -> None:
        self.origin = str(self.root)
        if not (self.root / LIB_MEMBER).is_file():
            raise WheelError(f"installed torch_npu at {self.root} has no {LIB_MEMBER}")

    def has(self, member: str) -> bool:
        return (self.root / member).is_file()

    def open(self, member: str) -> IO[bytes]:
        try:
            return (self.root / member).open("rb")
        except OSError as e:
            raise WheelError(f"cannot read {member} under {self.root}: {e}") from e

    def sha256(self) -> str:
        # The library is what the matrix is made of; hashing it identifies the build.
        return file_sha256(self.root / LIB_MEMBER)

    def close(self) -> None:
        pass  # nothing held open


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_text(reader: WheelReader, member: str) -> str | None:
    """A text member, or None when this build lacks it."""
    if not reader.has(member):
        return None
    with reader.open(member) as f:
        return f.read().decode("utf-8", errors="replace")


def wheel_version(reader: WheelReader) -> str | None:
    """``__version__`` from ``torch_npu/version.py`` (read as text, not imported)."""
    text = read_text(reader, VERSION_MEMBER)
    if text is None:
        return None
    m = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
    return m.group(1) if m else None


def iter_anchors(reader: WheelReader, member: str, pattern: re.Pattern[bytes]) -> Iterator[tuple[bytes, int]]:
    """(buffer, position) of every match of ``pattern`` in a large binary member, streamed.

    The member is read in overlapping chunks; a match is reported in the first buffer where it
    lies at least ``_SKIP`` bytes from the start (so callers can look back) and ``_SKIP`` bytes
    from the end (so callers can look ahead), except at the file's two ends. Each match is
    reported once; callers read the string around it from the buffer.
    """
    carry = b""
    offset = 0  # file offset of buf[0]
    with reader.open(member) as f:
        while True:
            chunk = f.read(_CHUNK)
            final = not chunk
            buf = carry + chunk
            lo = _SKIP if offset > 0 else 0
            hi = len(buf) if final else len(buf) - (_OVERLAP - _SKIP)
            for m in pattern.finditer(buf, lo):
                if m.start() >= hi:
                    break
                yield buf, m.start()
            if final:
                return
            carry = buf[-_OVERLAP:]
            offset += len(buf) - len(carry)


# --- locating a wheel ---------------------------------------------------------------------


def wheel_cache_dir() -> Path:
    env = settings().wheel_cache
    if env:
        d = Path(env).expanduser()
        d.mkdir(parents=True, exist_ok=True)
        return d
    return cache_dir("wheels")


def _norm_version(v: str) -> str:
    return v.strip().lower().lstrip("v")


def installed_torch_npu(version: str | None = None) -> InstalledDist | None:
    """The installed torch_npu distribution (matching ``version`` if given), without importing it."""
    try:
        dist = importlib.metadata.distribution("torch_npu")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version is not None and _norm_version(dist.version) != _norm_version(version):
        return None
    for f in dist.files or []:
        if str(f).replace("\\", "/") == LIB_MEMBER:
            lib = Path(str(dist.locate_file(f)))
            return InstalledDist(lib.parents[2])
    return None


def machine_arch() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def _cp_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def cached_wheel(version: str, cache: Path | None = None) -> Path | None:
    """A wheel for ``version`` already in the cache, best match for this interpreter first."""
    cache = cache or wheel_cache_dir()
    arch = machine_arch()
    found = [p for p in cache.glob("torch_npu-*.whl") if _wheel_file_version(p) == _norm_version(version)]
    found = [p for p in found if p.name.endswith(f"{arch}.whl")]
    found.sort(key=lambda p: (f"-{_cp_tag()}-" not in p.name, p.name))
    return found[0] if found else None


def _wheel_file_version(p: Path) -> str:
    parts = p.name.split("-")
    return _norm_version(parts[1]) if len(parts) > 2 else ""


def download_wheel(version: str, cache: Path | None = None, *, timeout_s: float = 900) -> Path:
    """``pip download`` the torch_npu wheel for this machine (Linux x86_64/aarch64) into the cache."""
    cache = cache or wheel_cache_dir()
    arch = machine_arch()
    if arch not in ("x86_64", "aarch64"):
        raise WheelDownloadError(
            f"torch_npu wheels exist for Linux x86_64 and aarch64, not {arch}", unreachable=False
        )
    # Explicit platform tags so a wheel for this machine's arch is chosen even on a non-manylinux
    # host; the Python tag stays the running interpreter's.
    plats = [f"manylinux_2_28_{arch}", f"manylinux_2_17_{arch}", f"manylinux2014_{arch}", f"linux_{arch}"]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-d",
        str(cache),
    ]
    for p in plats:
        cmd += ["--platform", p]
    cmd.append(f"torch-npu=={version}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise WheelDownloadError(
            f"pip download torch-npu=={version} timed out after {timeout_s:.0f}s", unreachable=True
        ) from e
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        unreachable = any(h in out for h in _UNREACHABLE_HINTS)
        why = "the package registry could not be reached" if unreachable else "no matching wheel"
        tail = "\n".join(out.strip().splitlines()[-6:])
        raise WheelDownloadError(
            f"could not download torch-npu=={version} for {arch} / {_cp_tag()} ({why}).\n"
            f"Pass a local wheel (--wheel PATH) or install torch_npu.\npip said:\n{tail}",
            unreachable=unreachable,
        )
    got = cached_wheel(version, cache)
    if got is None:
        raise WheelDownloadError(
            f"pip reported success but no torch_npu-{version} {arch} wheel is in {cache}", unreachable=False
        )
    return got


def open_wheel(path: Path) -> WheelReader:
    """A local ``.whl`` file or an unpacked/installed tree (a directory holding ``torch_npu/``)."""
    path = Path(path).expanduser()
    if path.is_dir():
        return InstalledDist(path)
    return ZipWheel(path)


def locate_wheel(version: str, wheel: Path | None = None, *, allow_download: bool = True) -> WheelReader:
    """The build for ``version``: ``wheel`` if given, else installed, else cached, else downloaded."""
    if wheel is not None:
        return open_wheel(wheel)
    inst = installed_torch_npu(version)
    if inst is not None:
        return inst
    cached = cached_wheel(version)
    if cached is not None:
        return ZipWheel(cached)
    if not allow_download:
        raise WheelError(f"no torch_npu {version} wheel installed or cached in {wheel_cache_dir()}")
    return ZipWheel(download_wheel(version))
