"""Package installs and native builds in the sandbox: only the folder being built is writable, and the
network reaches only the package index.

A layered env holds wheels the model's imports chose; a wheel can carry a ``.pth`` that runs whenever an
interpreter of that env starts, pip's own included (the second install into the env, ``pip check``).
ascend-sim's native engine is compiled by an env's interpreter too. So both run under bwrap like a model
run (sandbox/isolation/probe.py): the host read-only, homes and NPUPORT_HOME masked, no privilege, a scrubbed
environment, and only ``writable`` (the env folder, the build folder) writable.

Network: pip's configuration (``pip config list`` of npuport's own interpreter, which covers the
configuration files and the PIP_* variables) names the index, extra indexes and find-links. Local ones
(paths, ``file://``) are bound read-only; when some are remote, the run gets a proxy that lets through
only those hosts (sandbox/isolation/index_proxy.py, relayed inside the sandbox by sandbox/isolation/netgate.py); with
none, it has no network at all. pip runs without its cache (a shared cache would be one owner's install
writing another's) and with its temporary folder inside the writable folder (wheels can exceed the
sandbox's /tmp).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from sandbox.isolation.index_proxy import hosts_of, index_proxy
from sandbox.isolation.probe import run_probe

NETGATE = Path(__file__).resolve().with_name("netgate.py")
PYPI = "https://pypi.org/simple"
PYPI_FILES = ("files.pythonhosted.org", 443)
_LIST_KEYS = ("index-url", "extra-index-url", "find-links", "constraint", "requirement", "cert", "client-cert",
              "no-index")


def pip_config() -> dict[str, list[str]]:
    """pip's effective settings that decide where it reads from: key -> values (files and environment)."""
    # cached per PIP_* environment: a process that changes PIP_FIND_LINKS or PIP_NO_INDEX gets a fresh answer
    return _pip_config(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_"))))


@functools.lru_cache(maxsize=8)
def _pip_config(pip_env: tuple[tuple[str, str], ...]) -> dict[str, list[str]]:
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    conf: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2].strip()
        if name in _LIST_KEYS:
            try:
                values = shlex.split(value.strip().strip("'\""))
            except ValueError:
                values = value.split()
            conf.setdefault(name, []).extend(values)
    return conf


def _config_files() -> list[Path]:
    """pip configuration files outside /etc (which the sandbox shows anyway): the user's and PIP_CONFIG_FILE."""
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    found = [xdg / "pip" / "pip.conf", home / ".pip" / "pip.conf"]
    if os.environ.get("PIP_CONFIG_FILE"):
        found.append(Path(os.environ["PIP_CONFIG_FILE"]))
    return [p for p in found if p.is_file() and p != Path(os.devnull)]


def index_reach(conf: dict[str, list[str]] | None = None) -> tuple[set[tuple[str, int]], list[Path]]:
    """(remote hosts pip reads from, local paths it reads from) under ``conf`` (pip's configuration)."""
    conf = pip_config() if conf is None else conf
    no_index = any(v.lower() in ("1", "true", "yes", "on") for v in conf.get("no-index", []))
    urls = [] if no_index else (conf.get("index-url") or [PYPI])[-1:] + conf.get("extra-index-url", [])
    urls += conf.get("find-links", [])
    hosts = hosts_of(urls)
    if not no_index and not conf.get("index-url"):
        hosts.add(PYPI_FILES)  # pypi.org serves its files from there
    local: list[Path] = []
    for value in [*urls, *conf.get("constraint", []), *conf.get("requirement", []), *conf.get("cert", []),
                  *conf.get("client-cert", [])]:
        path = Path(value.removeprefix("file://")) if value.startswith(("file://", "/")) else None
        if path is not None and path.exists():
            local.append(path.resolve())
    return hosts, [*local, *_config_files()]


def run_pip(argv: list[str], *, writable: tuple[Path, ...], timeout: float,
            readable: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``argv`` (a pip command) confined: ``writable`` only, network only to the configured index hosts."""
    hosts, local = index_reach()
    scratch = writable[0] / ".npuport-pip-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    env.update(TMPDIR=str(scratch), PIP_NO_CACHE_DIR="1", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        with index_proxy(hosts) as proxy:
            cmd = argv if proxy is None else [sys.executable, "-I", "-S", str(NETGATE), str(proxy.path), "--", *argv]
            done = run_probe(cmd, timeout=timeout, env=env, readable=(*readable, *local),
                             writable=(*writable, *((proxy.path,) if proxy is not None else ())),
                             interpreters=_interpreters(argv))
            if proxy is not None and proxy.refused:
                done.stderr += "\nnpuport: the install's network is the package index only; refused: " + \
                    "; ".join(proxy.refused[:5])
            return done
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _interpreters(argv: list[str]) -> tuple[str, ...]:
    """pip's interpreter, and the one ``--python`` names (pip re-runs itself there)."""
    found = [argv[0]] if argv else []
    for i, a in enumerate(argv[:-1]):
        if a == "--python":
            found.append(argv[i + 1])
    return tuple(found)


def run_build(argv: list[str], *, writable: tuple[Path, ...], timeout: float,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A native build (a compiler run by an env's interpreter) confined: ``writable`` only, no network."""
    return run_probe(argv, timeout=timeout, env=env, writable=writable)
