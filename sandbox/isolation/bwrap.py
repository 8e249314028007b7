"""The bubblewrap sandbox: what a run sees of the host and what privilege it keeps (none).

The run's root is built from an allow-list: the system folders (``/usr``, ``/etc``, ``/opt``, the
``/lib*`` and ``/bin`` links...) read-only, a fresh ``/dev``, ``/proc`` and sized tmpfs on ``/tmp`` and
every home folder, the interpreter and its environment bound back read-only wherever they live, then
the caller's ``Mounts``. Everything else of the host (``/srv``, ``/var``, ``/mnt``, ``/work``,
``NPUPORT_HOME`` wherever it is, other owners' uploads and workspaces) does not exist in the run;
root-only files of ``/etc`` (``shadow``, ssh host keys) are masked. The model runs as uid 65534 in a
user namespace it does not own, with no capabilities and a seccomp filter (sandbox/isolation/confine.py).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from sandbox.isolation.confine import confinement


class Limits(Protocol):
    """What the bwrap command reads of sandbox.isolation.process.Limits (process.py imports this module)."""

    @property
    def tmpfs_mb(self) -> int: ...


class Mounts(Protocol):
    """What the bwrap command reads of sandbox.isolation.process.Mounts."""

    @property
    def hide(self) -> tuple[Path, ...]: ...

    @property
    def ro(self) -> tuple[Path, ...]: ...

    @property
    def rw(self) -> tuple[Path, ...]: ...

    @property
    def interpreters(self) -> tuple[str, ...]: ...

# Top-level folders of the host a run sees (read-only). Anything else is absent.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "sys")
MASK_MB = 256  # size of each home folder's tmpfs (caches the model's libraries write under $HOME)
_ETC_SCAN_MAX = 5000  # files looked at for root-only ones (a normal /etc has a few hundred)


def _interpreter_paths(python: str, depth: int = 0) -> set[Path]:
    """Folders an interpreter needs: its prefix, a venv's base interpreter, our own sys.path.

    A layered env's folder was writable to the pip installs of the model's wheels (sandbox/isolation/installs.py),
    so its ``pyvenv.cfg`` and ``npuport-env.json`` are data, not npuport's word: a ``home`` counts only when it
    holds a Python interpreter, a layer only when it is an env of npuport's env cache (knowledge/untrusted.py)."""
    paths: set[Path] = set()
    exe = Path(python)
    for p in (exe, exe.resolve()):
        paths.add(p.parent.parent)
        cfg = p.parent.parent / "pyvenv.cfg"
        if cfg.is_file():
            for line in cfg.read_text(errors="replace").splitlines()[:50]:
                key, _, value = line.partition("=")
                home = Path(value.strip())
                if key.strip() == "home" and home.is_absolute() and any(home.glob("python3*")):
                    paths.add(home.parent)
        # A layered env (agents/environment/resolve.py) names the folders it reads besides its own: a torch pair's
        # base env. Under a masked home they are invisible unless bound too.
        marker = p.parent.parent / "npuport-env.json"
        if marker.is_file() and depth < 3:
            for layer in _env_layers(marker):
                paths |= _interpreter_paths(str(layer / "bin" / "python"), depth + 1)
    return paths


def _env_roots() -> list[Path]:
    """Where npuport keeps layered envs (NPUPORT_ENV_CACHE, else $NPUPORT_HOME/envs)."""
    from knowledge.settings import settings

    conf = settings()
    roots = [conf.env_cache.expanduser()] if conf.env_cache else []
    with contextlib.suppress(OSError, RuntimeError):
        roots.append(conf.resolved_home() / "envs")
    return [r.resolve() for r in roots]


def _env_layers(marker: Path) -> list[Path]:
    """The layers a layered env's marker names that are envs of npuport's env cache (never a host folder)."""
    from knowledge.untrusted import is_inside

    try:
        layers = json.loads(marker.read_text()).get("layers") or []
    except (OSError, ValueError, AttributeError):
        return []
    roots = _env_roots()
    return [Path(layer) for layer in layers if isinstance(layer, str) and Path(layer).is_absolute()
            and Path(layer).is_dir() and any(is_inside(root, Path(layer)) and Path(layer).resolve() != root
                                             for root in roots)]


def _host_paths(argv: list[str], interpreters: tuple[str, ...] = ()) -> list[Path]:
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix)}
    paths |= _interpreter_paths(sys.executable)
    for python in ([argv[0]] if argv else []) + list(interpreters):
        if "python" in Path(python).name:
            paths |= _interpreter_paths(python)
    # sys.path's package folders only: its first entry may be the server's cwd (a home directory)
    paths |= {Path(p) for p in sys.path if p and Path(p).is_dir()
              and ("site-packages" in p or "dist-packages" in p or Path(p).name.startswith("python"))}
    paths.add(Path(__file__).resolve().parents[2])  # the npuport package itself (editable installs)
    # NPUPORT_HOME is not bound: it holds other jobs' workspaces, uploads and the job database. What a run
    # needs from it (the op matrix, the native engine, a layered env) is bound by path.
    paths.add(Path.home() / ".cache" / "npuport")  # the shared native engine cache
    from knowledge.settings import settings

    conf = settings()
    paths |= {p for p in (conf.native_cache, conf.env_cache) if p is not None}
    return sorted({p.resolve() for p in paths if p.exists()} | {p for p in paths if p.exists()})


def _homes() -> list[Path]:
    homes = {Path.home(), Path("/root"), Path("/home")}
    return sorted(h for h in homes if h.is_dir() and h != Path("/"))


def _private_etc_files() -> list[Path]:
    """Files under /etc that only their owner may read (shadow, ssh host keys). The run's uid maps to
    the server's outside the namespace, so owner-only files of the server's user would be readable."""
    return list(_private_etc_cached())


@functools.lru_cache(maxsize=1)
def _private_etc_cached() -> tuple[Path, ...]:
    found: list[Path] = []
    seen = 0
    for root, _dirs, files in os.walk("/etc"):
        for name in files:
            seen += 1
            if seen > _ETC_SCAN_MAX:
                return tuple(found)
            p = Path(root) / name
            with contextlib.suppress(OSError):
                st = p.lstat()
                if stat.S_ISREG(st.st_mode) and not st.st_mode & stat.S_IROTH:
                    found.append(p)
    return tuple(found)


@functools.lru_cache(maxsize=4)
def _features(bwrap: str) -> frozenset[str]:
    """Options this bwrap knows (``--disable-userns`` came in 0.8, ``--size`` in 0.5)."""
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(w for w in ("--disable-userns", "--size", "--cap-drop", "--seccomp") if w in out)


def _npuport_home() -> Path | None:
    from knowledge.home import npuport_home

    with contextlib.suppress(OSError, RuntimeError):
        return npuport_home().resolve()
    return None


def bwrap_command(bwrap: str, argv: list[str], *, cwd: Path, mounts: Mounts, limits: Limits,
                  filter_fd: int | None = None) -> list[str]:
    """The bwrap command line that runs ``argv`` confined (sandbox/isolation/confine.py) in an allow-listed view."""
    feats = _features(bwrap)
    conf = confinement(filter_fd if "--seccomp" in feats else None)
    if "--disable-userns" not in feats:
        conf.remove("--disable-userns")  # the seccomp filter refuses new user namespaces as well
    args = [bwrap, *conf, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    for name in SYSTEM_DIRS:
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    for private in _private_etc_files():
        args += ["--ro-bind", "/dev/null", str(private)]
    args += ["--dev", "/dev", "--proc", "/proc"]

    def tmpfs(path: Path, mb: int) -> list[str]:
        return (["--size", str(mb * 1024 * 1024)] if "--size" in feats else []) + ["--tmpfs", str(path)]

    args += tmpfs(Path("/tmp"), limits.tmpfs_mb)
    for masked in _homes():
        if masked.is_dir() and not masked.is_symlink():
            args += tmpfs(masked, min(MASK_MB, limits.tmpfs_mb))
    home = _npuport_home()
    if home is not None and home.is_dir() and home != Path("/"):
        args += tmpfs(home, 1)  # other owners' uploads, workspaces and job databases, wherever it lives
    masks = {Path("/tmp"): limits.tmpfs_mb, **{h: min(MASK_MB, limits.tmpfs_mb) for h in _homes()},
             **({home: 1} if home is not None else {})}
    binds = [("--ro-bind", p) for p in _host_paths(argv, mounts.interpreters)]
    binds += [("--ro-bind", _not_the_root(p)) for p in mounts.ro] + [("--bind", _not_the_root(p)) for p in mounts.rw]
    for p in mounts.hide:
        args += tmpfs(p, 1)
    args += [a for kind, p in binds for a in (kind, str(p), str(p))]
    # Masks after binds: a bind of a folder that holds a masked one (a test's tmp folder holding NPUPORT_HOME, a
    # path that came from data) does not lift the mask; binds inside the mask are made again on top of it.
    for mask, mb in masks.items():
        if any(_holds(p, mask) for _, p in binds):
            args += tmpfs(mask, mb)
            args += [a for kind, p in binds if _holds(mask, p) and p != mask for a in (kind, str(p), str(p))]
    for private in _private_etc_files():  # a bind of (part of) /etc cannot bring the root-only files back
        args += ["--ro-bind", "/dev/null", str(private)]
    return [*args, "--chdir", str(cwd), *argv]


def _holds(folder: Path, path: Path) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both resolved)."""
    f, p = Path(folder).resolve(), Path(path).resolve()
    return p == f or f in p.parents


def _not_the_root(path: Path) -> Path:
    """A caller's bind, never the host's root (which would bring back every folder the allow-list leaves out)."""
    if Path(path).resolve() == Path("/"):
        raise ValueError("refusing to bind / into a sandbox: its root is an allow-list")
    return path
