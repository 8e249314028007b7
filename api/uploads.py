"""Where a job's model may come from: a folder under a configured root, or an uploaded archive.

Archives (zip, tar, tar.gz) are checked member by member before anything is written: no
absolute names, no ``..``, no links that leave the extraction folder, no devices or fifos, a
cap on the total unpacked size and on the member count. After extraction the tree is walked
once more and every symlink is resolved, so nothing can point outside.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from knowledge.errors import UploadError


def confine_model_path(raw: str, roots: Sequence[Path]) -> Path:
    """Resolve ``raw`` (symlinks followed; relative paths against each root in turn) and require it
    to be a folder inside one of ``roots``."""
    if not roots:
        raise UploadError("no model roots are configured (NPUPORT_ALLOWED_ROOTS); upload an archive instead", 403)
    if "\x00" in raw:
        raise UploadError("model path contains a NUL byte")
    resolved_roots = [r.expanduser().resolve() for r in roots]
    p = Path(raw).expanduser()
    candidates = [p] if p.is_absolute() else [r / p for r in resolved_roots]
    inside_but_not_folder = False
    for cand in candidates:
        real = cand.resolve()
        if any(real.is_relative_to(r) for r in resolved_roots):
            if real.is_dir():
                return real
            inside_but_not_folder = True
    if inside_but_not_folder:
        raise UploadError(f"model path {raw} is not a folder under the allowed model roots", 400)
    # outside every root: say so whether or not it exists (no probing of the server's disk)
    raise UploadError(f"model path {raw} is outside the allowed model roots", 403)


@dataclass
class _Member:
    name: str
    kind: str  # file | dir | symlink | hardlink
    size: int
    link: str = ""


def _check_name(name: str) -> str:
    if not name or "\x00" in name:
        raise UploadError("archive member with an empty or NUL name")
    if "\\" in name:
        raise UploadError(f"archive member {name!r}: backslashes are not allowed")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UploadError(f"archive member {name!r}: absolute paths are not allowed")
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise UploadError(f"archive member {name!r}: path traversal ('..') is not allowed")
    norm = posixpath.normpath(name)
    if norm in (".", ""):
        return "."
    return norm


def _check_link(name: str, target: str, kind: str) -> None:
    if not target or target.startswith("/"):
        raise UploadError(f"archive member {name!r}: {kind} to an absolute path is not allowed")
    base = posixpath.dirname(name) if kind == "symlink" else ""
    joined = posixpath.normpath(posixpath.join(base, target))
    if joined == ".." or joined.startswith("../"):
        raise UploadError(f"archive member {name!r}: {kind} escapes the archive ({target})")


def _zip_members(zf: zipfile.ZipFile) -> list[_Member]:
    out = []
    for info in zf.infolist():
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            out.append(_Member(info.filename, "symlink", 0, zf.read(info).decode("utf-8", "replace")))
        elif info.is_dir():
            out.append(_Member(info.filename, "dir", 0))
        elif stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: written without a file type (zipfile.writestr)
            raise UploadError(f"archive member {info.filename!r}: special files are not allowed")
        else:
            out.append(_Member(info.filename, "file", info.file_size))
    return out


def _tar_members(tf: tarfile.TarFile) -> list[_Member]:
    out = []
    for m in tf.getmembers():
        if m.issym():
            out.append(_Member(m.name, "symlink", 0, m.linkname))
        elif m.islnk():
            out.append(_Member(m.name, "hardlink", 0, m.linkname))
        elif m.isdir():
            out.append(_Member(m.name, "dir", 0))
        elif m.isfile():
            out.append(_Member(m.name, "file", m.size))
        else:
            raise UploadError(f"archive member {m.name!r}: devices and fifos are not allowed")
    return out


def _validate(members: list[_Member], max_bytes: int, max_members: int) -> None:
    if len(members) > max_members:
        raise UploadError(f"archive has {len(members)} members; the cap is {max_members}", 413)
    total = 0
    links = {_check_name(m.name) for m in members if m.kind in ("symlink", "hardlink")}
    seen: set[str] = set()
    for m in members:
        name = _check_name(m.name)
        if name in seen and (m.kind != "dir" or name in links):
            raise UploadError(f"archive member {m.name!r} appears twice")
        seen.add(name)
        # Nothing is written through a link: a chain of symlinks (a -> ., a/b -> ..) each harmless alone
        # would otherwise carry a later member outside the folder, whatever the order of members.
        parts = PurePosixPath(name).parts
        for i in range(1, len(parts)):
            if posixpath.join(*parts[:i]) in links:
                raise UploadError(f"archive member {m.name!r} lies under a link ({posixpath.join(*parts[:i])})")
        if m.kind in ("symlink", "hardlink"):
            _check_link(m.name, m.link, m.kind)
        total += m.size
        if total > max_bytes:
            raise UploadError(f"archive unpacks to more than {max_bytes} bytes", 413)


def _verify_tree(root: Path) -> None:
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                continue
            try:
                real = p.resolve(strict=True)
            except (OSError, RuntimeError) as exc:  # dangling, or a loop
                raise UploadError(f"archive member {p.relative_to(root)} is a symlink to nothing") from exc
            if not real.is_relative_to(real_root):
                raise UploadError(f"archive member {p.relative_to(root)} links outside the archive")


def extract_archive(data: bytes, filename: str, dest: Path, *, max_bytes: int, max_members: int) -> Path:
    """Check and unpack an uploaded archive into ``dest``; returns the model folder inside it."""
    dest.mkdir(parents=True, exist_ok=False)
    try:
        _extract(data, filename, dest, max_bytes=max_bytes, max_members=max_members)
        _verify_tree(dest)
    except OSError as exc:  # a member the checks let through but the disk refused: the client's archive
        shutil.rmtree(dest, ignore_errors=True)
        raise UploadError(f"cannot unpack the archive: {exc.strerror or exc}") from exc
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return _model_root(dest)


def _extract(data: bytes, filename: str, dest: Path, *, max_bytes: int, max_members: int) -> None:
    buf = io.BytesIO(data)
    if zipfile.is_zipfile(buf):
        with zipfile.ZipFile(buf) as zf:
            members = _zip_members(zf)
            _validate(members, max_bytes, max_members)
            written = 0
            # links last: every file and folder is written before any link exists
            ordered = sorted(zip(zf.infolist(), members, strict=True), key=lambda im: im[1].kind == "symlink")
            for info, m in ordered:
                target = dest / _check_name(m.name)
                if m.kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                elif m.kind == "symlink":
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(m.link, target)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(target, "wb") as dst:
                        # count what is really inflated, not what the header claims (zip bombs)
                        while chunk := src.read(1 << 16):
                            written += len(chunk)
                            if written > max_bytes:
                                raise UploadError(f"archive unpacks to more than {max_bytes} bytes", 413)
                            dst.write(chunk)
        return
    buf.seek(0)
    try:
        tf = tarfile.open(fileobj=buf, mode="r:*")  # noqa: SIM115 - closed by the with below
    except tarfile.TarError as exc:
        raise UploadError(f"{filename or 'upload'} is not a zip or tar(.gz) archive") from exc
    with tf:
        try:
            members = _tar_members(tf)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise UploadError(f"corrupt tar archive: {exc}") from exc
        _validate(members, max_bytes, max_members)
        try:
            # the "data" filter re-checks names and links and drops modes we do not want
            tf.extractall(dest, filter="data")
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise UploadError(f"cannot unpack the archive: {exc}") from exc


def _model_root(dest: Path) -> Path:
    """The folder holding the model: the archive root, or its single top-level folder."""
    entries = [p for p in dest.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    if not entries:
        raise UploadError("the archive is empty")
    return dest
