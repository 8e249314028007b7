"""Where a port's model comes from: the user's folder as is, or a staged copy under the batch folder
(an archive unpacked, or a folder whose config takes the batch's `shrink` overrides). The user's own
files are never written."""

from __future__ import annotations

import json
import shutil
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from knowledge.errors import SourceError, UntrustedValue
from knowledge.untrusted import MAX_CONFIG_BYTES, inside, is_inside, read_json_object
from sandbox.isolation.rundir import write_own

MAX_MEMBERS = 10_000
MAX_BYTES = 2 * 1024**3


def _safe_names(names: list[str]) -> None:
    if len(names) > MAX_MEMBERS:
        raise SourceError(f"the archive has {len(names)} members (cap {MAX_MEMBERS})")
    for n in names:
        parts = PurePosixPath(n).parts
        if n.startswith("/") or ".." in parts or "\\" in n or "\x00" in n:
            raise SourceError(f"archive member {n!r}: absolute paths and '..' are not allowed")


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack into ``dest`` (tar with Python's 'data' filter: no links out, no devices; zip names
    checked) and return the model folder: the single top-level folder, or ``dest`` itself."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                _safe_names([i.filename for i in infos])
                if sum(i.file_size for i in infos) > MAX_BYTES:
                    raise SourceError(f"{archive.name} unpacks to more than {MAX_BYTES} bytes")
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tf:
                members = tf.getmembers()
                _safe_names([m.name for m in members])
                if sum(m.size for m in members) > MAX_BYTES:
                    raise SourceError(f"{archive.name} unpacks to more than {MAX_BYTES} bytes")
                tf.extractall(tmp, filter="data")
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(f"cannot unpack {archive.name}: {exc}") from exc
    except SourceError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # the staged copy appears whole or not at all
    entries = [p for p in dest.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def _shrink_overrides(shrink: bool | dict[str, Any]) -> dict[str, Any]:
    # `shrink: true` is the request's (the harness derives the small config, sandbox/harness/shrink.py, and
    # applies the model's own npuport.yaml overrides); only a batch's dict of overrides is staged here.
    return dict(shrink) if isinstance(shrink, dict) else {}


def _config_file(model: Path) -> Path:
    """The config file the model's npuport.yaml names (``config.json`` by default), resolved inside ``model``:
    a ``config:`` that climbs out of the folder (``..``, an absolute path, a link out) is refused, never followed
    (knowledge/untrusted.py)."""
    manifest = model / "npuport.yaml"
    name: Any = "config.json"
    if manifest.is_file():
        try:
            data = yaml.safe_load(manifest.read_text()) or {}
        except yaml.YAMLError as exc:
            raise SourceError(f"npuport.yaml: not valid YAML: {str(exc)[:200]}") from exc
        if isinstance(data, dict) and data.get("config") is not None:
            name = data["config"]
    try:
        return inside(model, name, "npuport.yaml config")
    except UntrustedValue as exc:
        raise SourceError(f"shrink: {exc}") from exc


def stage(source: Path, kind: str, shrink: bool | dict[str, Any], staging: Path) -> tuple[Path, str]:
    """The folder the port starts from, and a note for the report ('' when the user's folder is used as is)."""
    notes = []
    if kind == "archive":
        model = unpack(source, staging / "unpacked")
        notes.append(f"unpacked {source.name}")
    else:
        model = source
    overrides = _shrink_overrides(shrink)
    if overrides:
        if not _config_file(model).is_file():
            raise SourceError(f"shrink: no config file {_config_file(model).name} to apply {sorted(overrides)} to")
        if model == source:  # copy first: the user's folder is never written
            dest = staging / "shrunk"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))
            model = dest
        # resolved again inside the staged copy, which npuport owns: a link in it that leads out is refused
        cfg = _config_file(model)
        if not is_inside(staging, cfg):
            raise SourceError(f"shrink: the config {cfg.name} is not inside the staged copy")
        try:
            config = read_json_object(cfg, MAX_CONFIG_BYTES, "shrink config")
        except UntrustedValue as exc:
            raise SourceError(str(exc)) from exc
        config.update(overrides)
        write_own(cfg, json.dumps(config, indent=1))  # a new file under the name: never written through a link
        notes.append(f"shrunk config ({', '.join(f'{k}={v}' for k, v in overrides.items())})")
    return model, "; ".join(notes)
