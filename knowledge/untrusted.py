"""Untrusted files are data: the one place where what npuport reads from a model folder, an upload, a
manifest or a bundle becomes typed values before any unsandboxed code uses it.

The rule (docs/security.md, "Untrusted files are data"): a value from such a file is parsed against an
allow-list (a dtype of the list below, a version the compatibility table lists, a package version of PEP
440, a name of a known shape) or it is dropped; a path from such a file is only ever a *relative* path
that resolves, symlinks followed, inside the folder it came from (:func:`inside`); text from such a file
that reaches a generated script is one line (:func:`one_line`) or a ``shlex.quote``d value. Paths on
npuport's own side (the bundle, the original, the roots) come from the user or the operator, never from
the files.

Every reader of those files goes through this module (tests/security/test_untrusted_fields.py walks
them): agents/reading/entry.py (npuport.yaml), graph/batch/sources.py and manifest.py (the batch stager
and manifest), agents/deploy/verify_input.py (a bundle's report.json, deployment.json, deploy.json),
agents/deploy/bundle.py and agents/tuning (config.json read outside the sandbox), api/uploads.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import AfterValidator

from knowledge.errors import UntrustedValue

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # a config.json larger than this is not a config
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a bundle's report.json (it lists every run)


# --- paths --------------------------------------------------------------------------------------------

def relative_path(value: Any, what: str = "path") -> str:
    """A relative POSIX path with no ``..``, no absolute start, no NUL or backslash; the lexical half of
    :func:`inside` (which also resolves links against the folder)."""
    if not isinstance(value, str) or not value.strip():
        raise UntrustedValue(f"{what}: not a path ({value!r})")
    if "\x00" in value or "\\" in value or len(value) > 1024:
        raise UntrustedValue(f"{what}: {value[:80]!r} is not a plain relative path")
    pure = PurePosixPath(value)
    if pure.is_absolute() or value.startswith("~") or ".." in pure.parts:
        raise UntrustedValue(f"{what}: {value!r} leaves its folder (absolute, ~ or ..); only paths inside it are read")
    return pure.as_posix()


RelPath = Annotated[str, AfterValidator(relative_path)]
"""A pydantic field type: a relative path that cannot climb out of its folder lexically."""


def inside(folder: Path, value: Any, what: str = "path") -> Path:
    """``folder / value`` resolved (symlinks followed), which must stay inside ``folder``: the only way a
    path written in an untrusted file becomes a path npuport opens. Raises UntrustedValue otherwise."""
    rel = relative_path(value, what)
    root = Path(folder).resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise UntrustedValue(f"{what}: {value!r} resolves outside its folder (to {target})")
    return target


def is_inside(folder: Path, path: Path) -> bool:
    """Whether ``path`` (resolved) is ``folder`` (resolved) or below it."""
    root, p = Path(folder).resolve(), Path(path).resolve()
    return p == root or root in p.parents


# --- text ------------------------------------------------------------------------------------------

_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def one_line(value: Any, cap: int = 300) -> str:
    """Text from an untrusted file as one line of at most ``cap`` characters: every control character and
    line separator (newline, carriage return, form feed, NEL, U+2028/9) becomes a space. A script comment
    built from it stays a comment."""
    return _LINE_BREAKS.sub(" ", str(value))[:cap]


_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def shell_name(value: Any, what: str = "name") -> str:
    """An environment variable's name (``export NAME=...``): letters, digits, underscores."""
    if not isinstance(value, str) or not _SHELL_NAME.match(value):
        raise UntrustedValue(f"{what}: {str(value)[:80]!r} is not a variable name")
    return value


def flag_name(value: Any, what: str = "flag") -> str:
    """A command-line flag's name without its dashes (``max-model-len``), or a JSON key of the same shape."""
    if not isinstance(value, str) or not _FLAG_NAME.match(value):
        raise UntrustedValue(f"{what}: {str(value)[:80]!r} is not a flag name")
    return value


# --- values of an allow-list -----------------------------------------------------------------------

DTYPES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int16",
          "int32", "int64", "bool", "complex64", "auto")
"""Every dtype name a config.json's ``torch_dtype`` / ``dtype`` or a report's metrics may carry."""


def dtype_name(value: Any, default: str = "float32") -> str:
    """A dtype of :data:`DTYPES` (``torch.float16`` reads as ``float16``), else ``default``."""
    name = str(value).removeprefix("torch.") if isinstance(value, str) else ""
    return name if name in DTYPES else default


def package_version(value: Any) -> str | None:
    """A PEP 440 version as its normal form (``2.13.0+cpu`` -> ``2.13.0+cpu``), else None."""
    from packaging.version import InvalidVersion, Version

    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return str(Version(value.strip()))
    except InvalidVersion:
        return None


_DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,100}[A-Za-z0-9])?$")


def distribution_name(value: Any) -> str | None:
    """A distribution name of PEP 508's shape (a requirements.txt line holds nothing else), else None."""
    return value if isinstance(value, str) and _DIST_NAME.match(value) else None


def int_value(value: Any, default: int = 0, lo: int = 0, hi: int = 2**40) -> int:
    """An integer within [lo, hi] (a bool or a string is not one), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi else default


def number_value(value: Any, default: float, lo: float, hi: float) -> float:
    """A finite number within [lo, hi], given as a number or a numeric string (a serve setting's value, which
    may come from a doc), else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return default
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return default
    return number if math.isfinite(number) and lo <= number <= hi else default


# --- files -----------------------------------------------------------------------------------------

def read_json_object(path: Path, max_bytes: int, what: str) -> dict[str, Any]:
    """A JSON object from a regular file (no link, FIFO or device) of at most ``max_bytes``."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UntrustedValue(f"{what}: cannot read {path.name}: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedValue(f"{what}: {path.name} is not a regular file")
    if st.st_size > max_bytes:
        raise UntrustedValue(f"{what}: {path.name} is {st.st_size} bytes; the cap is {max_bytes}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(max_bytes + 1)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise UntrustedValue(f"{what}: {path.name} is not JSON: {str(exc)[:120]}") from exc
    if not isinstance(data, dict):
        raise UntrustedValue(f"{what}: {path.name} is not a JSON object")
    return data


def model_config_path(model_dir: Path, manifest: dict[str, Any] | None) -> Path:
    """The config file a model's manifest (npuport.yaml's ``config:``, or the entry npuport derived) names,
    resolved inside ``model_dir``; ``config.json`` when it names none. Raises UntrustedValue for a path that
    leaves the folder."""
    name = (manifest or {}).get("config") or "config.json"
    return inside(model_dir, name, "config")


def read_model_config(model_dir: Path, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model's config (a JSON object) read outside the sandbox: from inside its folder, a regular file,
    bounded; {} when there is none. Raises UntrustedValue for a path out of the folder or a file that is
    not a config."""
    path = model_config_path(model_dir, manifest)
    if not path.exists():
        return {}
    return read_json_object(path, MAX_CONFIG_BYTES, "config")
