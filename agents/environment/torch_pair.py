"""torch companions (torchvision, torchaudio) are compiled against one torch build: a companion wheel
built for another torch (a CUDA torchvision beside a +cpu torch, or another release) fails at import
with "operator torchvision::nms does not exist". When the model imports a companion, the pair it runs
on is chosen here and PROVEN by importing the companion and running one of its native ops in the
environment that will run the model:

1. the host's own torch and companion, when they load together;
2. the host's torch with the companion release of its line from the package index (installed
   without dependencies into a scratch folder and probed beside the host's torch);
3. a torch + companion pair the package index offers, installed into a base environment of its own
   (several GB; built once, cached by the pair, shown with progress).

The chosen pair and the reason (including why the earlier steps failed) go to the report and the
bundle's requirements/constraints.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from knowledge.errors import EnvBuildError

COMPANIONS = ("torchvision", "torchaudio")
BASE_MARKER = "npuport-torch-env.json"
MAX_PAIR_ATTEMPTS = 2  # each attempt installs several GB; two failures say enough

# One native op per companion: an import alone does not load the operator library.
PROBES = {
    "torchvision": ("import torchvision\n"
                    "b = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])\n"
                    "keep = torchvision.ops.nms(b, torch.tensor([0.9, 0.8, 0.7]), 0.5)\n"
                    "assert keep.tolist() == [0, 2], keep\n"
                    "out['torchvision'] = torchvision.__version__\n"),
    "torchaudio": ("import torchaudio\n"
                   "torchaudio.functional.amplitude_to_DB(torch.ones(1, 4), 10.0, 1e-10, 0.0)\n"
                   "out['torchaudio'] = torchaudio.__version__\n"),
}

Log = Callable[[str], None]
IndexVersions = Callable[[str], list[str]]


@dataclass
class TorchPair:
    torch: str
    companions: dict[str, str]  # torchvision -> "0.29.1"
    source: str  # host | host+index | index
    reason: str
    proof: str  # what the probe ran and printed
    base_env: str | None = None  # a base environment with its own torch (source "index")
    overlay: list[str] = field(default_factory=list)  # companions installed over the host's torch

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def release_of(version: str) -> str:
    """'2.10.0.post4' -> '2.10.0'; '2.13.0+cpu' -> '2.13.0'."""
    try:
        return ".".join(str(p) for p in Version(version).release)
    except InvalidVersion:
        return version


def minor_of(version: str) -> tuple[int, int]:
    rel = Version(release_of(version)).release
    return rel[0], rel[1] if len(rel) > 1 else 0


def paired_line(companion: str, torch_version: str, compat: dict[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of the companion release that pairs with a torch release (agents/data/compat.yaml)."""
    rule = compat.get("torch_companions", {}).get(companion)
    if not rule:
        return None
    major, minor = minor_of(torch_version)
    if rule.get("same"):
        return major, minor
    return (0, minor + int(rule["offset"])) if major == 2 else None


def probe(python: str, companions: list[str], extra_path: list[str] | None = None,
          timeout_s: float = 300.0) -> tuple[bool, str]:
    """Import torch and each companion in ``python`` and run one native op of each: (ok, versions or
    the error's last line)."""
    code = "import json, torch\nout = {'torch': torch.__version__}\n" + \
        "".join(PROBES[c] for c in companions) + "print(json.dumps(out))\n"
    from sandbox.isolation.probe import (
        run_probe,  # the env's .pth files run when it starts: inside the sandbox
    )

    env = {"PYTHONPATH": os.pathsep.join(extra_path)} if extra_path else {}
    try:
        done = run_probe([python, "-c", code], timeout=timeout_s, env=env,
                         readable=tuple(Path(p) for p in extra_path or ()))
    except subprocess.TimeoutExpired:
        return False, f"the probe took over {timeout_s:g} s"
    if done.returncode == 0:
        return True, done.stdout.strip().splitlines()[-1]
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit {done.returncode}"


def pip_index_versions(package: str, python: str | None = None) -> list[str]:
    """Releases of ``package`` the configured package index offers (pip's own configuration)."""
    try:
        done = subprocess.run([python or sys.executable, "-m", "pip", "index", "versions", package,
                               "--disable-pip-version-check"], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return []
    match = re.search(r"Available versions:\s*(.+)", done.stdout)
    return [v.strip() for v in match.group(1).split(",")] if match else []


def pip_constraints() -> list[str]:
    """The upper bounds pip is configured to honour (``pip config``'s constraint files): a pair beyond
    them would be refused at install time, so it is never tried."""
    files = []
    try:
        conf = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              timeout=60).stdout
        files = [m.group(1) for m in re.finditer(r"constraint\w*='([^']+)'", conf)]
    except subprocess.TimeoutExpired:
        pass
    if os.environ.get("PIP_CONSTRAINT"):
        files += os.environ["PIP_CONSTRAINT"].split()
    lines: list[str] = []
    for f in files:
        with contextlib.suppress(OSError):
            lines += [ln.split("#")[0].strip() for ln in Path(f).read_text().splitlines() if ln.split("#")[0].strip()]
    return lines


def _allowed(package: str, version: str, constraints: list[str]) -> bool:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    for line in constraints:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == canonicalize_name(package) and \
                not req.specifier.contains(version, prereleases=True):
            return False
    return True


def _final(versions: list[str]) -> list[Version]:
    out = []
    for v in versions:
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if not parsed.is_prerelease and not parsed.is_devrelease and parsed.local is None:
            out.append(parsed)
    return sorted(set(out), reverse=True)


def companion_on_line(companion: str, line: tuple[int, int], offered: list[str]) -> str | None:
    """The newest final release of a companion on a (major, minor) line that the index offers."""
    return next((str(v) for v in _final(offered) if v.release[:2] == line), None)


def candidate_pairs(companions: list[str], host_torch: str | None, index: IndexVersions, compat: dict[str, Any],
                    constraints: list[str]) -> list[tuple[str, dict[str, str]]]:
    """torch + companion releases the index offers and pip's constraints allow, each torch release
    with the newest companion release of its line: the host's torch release first (the smallest
    change), then the newest."""
    offered = {c: index(c) for c in companions}
    pairs: list[tuple[str, dict[str, str]]] = []
    for tv in _final(index("torch")):
        torch_v = str(tv)
        if not _allowed("torch", torch_v, constraints):
            continue
        chosen: dict[str, str] = {}
        for c in companions:
            line = paired_line(c, torch_v, compat)
            version = companion_on_line(c, line, [v for v in offered[c] if _allowed(c, v, constraints)]) \
                if line else None
            if version is None:
                break
            chosen[c] = version
        if len(chosen) == len(companions):
            pairs.append((torch_v, chosen))
    if host_torch:
        pairs.sort(key=lambda p: release_of(p[0]) != release_of(host_torch))  # stable: newest stays first otherwise
    return pairs


def base_env_name(torch_v: str, companions: dict[str, str]) -> str:
    parts = [f"torch-{torch_v}", *(f"{c}-{v}" for c, v in sorted(companions.items()))]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"
    return "_".join(parts) + f"_{tag}"


def base_python(env_dir: Path) -> Path:
    return env_dir / "bin" / "python"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _host_interpreter() -> str:
    """The base interpreter behind npuport's venv: a base env must not inherit npuport's packages."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _pip(argv: list[str], log: Log, what: str, timeout_s: float) -> tuple[int, str]:
    """Run pip with its output streamed to ``log`` (a line per step, a heartbeat every 30 s)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    last = {"t": time.monotonic()}
    start = time.monotonic()

    def heartbeat() -> None:
        while proc.poll() is None:
            time.sleep(5)
            if time.monotonic() - last["t"] > 30 and proc.poll() is None:
                log(f"{what}: still installing ({time.monotonic() - start:.0f} s)")
                last["t"] = time.monotonic()

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if not line or line.startswith("WARNING: Location"):
            continue
        tail = (tail + [line])[-12:]
        if line.startswith(("Collecting", "Processing", "Downloading", "Installing", "Successfully")):
            log(f"{what}: {line[:160]}")
            last["t"] = time.monotonic()
        if time.monotonic() - start > timeout_s:
            proc.kill()
            break
    rc = proc.wait()
    return rc, "\n".join(tail)


def ensure_base_env(torch_v: str, companions: dict[str, str], root: Path, log: Log,
                    timeout_s: float = 3600.0) -> tuple[Path, str]:
    """A venv holding torch ``torch_v`` and the companions (built once under ``root``, proven by the
    probe before it is published): (its python, the probe's output)."""
    name = base_env_name(torch_v, companions)
    env_dir = root / name
    marker = env_dir / BASE_MARKER
    with _locked(root / f"{name}.lock"):
        if marker.is_file() and base_python(env_dir).exists():
            return base_python(env_dir), str(json.loads(marker.read_text()).get("proof", ""))
        partial = root / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        made = subprocess.run([_host_interpreter(), "-m", "venv", "--without-pip", str(partial)],
                              capture_output=True, text=True)
        if made.returncode != 0:
            raise EnvBuildError(f"could not create a venv at {partial}: {made.stderr.strip()[-500:]}")
        reqs = [f"torch=={torch_v}", *(f"{c}=={v}" for c, v in sorted(companions.items()))]
        what = f"torch pair {' + '.join(reqs)}"
        log(f"{what}: building a base environment once in {env_dir} (several GB; minutes)")
        start = time.monotonic()
        # pip of npuport's interpreter installs into the new venv (--python); wheels only: no setup.py runs here.
        rc, tail = _pip([sys.executable, "-m", "pip", "--python", str(base_python(partial)), "install", "--no-input",
                         "--disable-pip-version-check", "--only-binary=:all:", "--progress-bar", "off", *reqs],
                        log, what, timeout_s)
        if rc != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise EnvBuildError(f"installing {' '.join(reqs)} failed (pip exit {rc}):\n{tail}")
        ok, proof = probe(str(base_python(partial)), sorted(companions))
        if not ok:
            shutil.rmtree(partial, ignore_errors=True)
            raise EnvBuildError(f"{' '.join(reqs)} installed but does not load together: {proof}")
        shutil.rmtree(env_dir, ignore_errors=True)
        partial.rename(env_dir)
        marker.write_text(json.dumps({"torch": torch_v, "companions": companions, "proof": proof,
                                      "built_s": round(time.monotonic() - start, 1)}, indent=1))
        log(f"{what}: ready in {time.monotonic() - start:.0f} s ({proof})")
    return base_python(env_dir), proof


def _try_overlay(companions: dict[str, str], host_torch: str, host_python: str, root: Path,
                 log: Log) -> tuple[bool, str]:
    """Install the companions without dependencies into a scratch folder and probe them beside the
    host's torch (cheap: no torch is installed)."""
    with tempfile.TemporaryDirectory(dir=root, prefix="overlay-probe-") as tmp:
        reqs = [f"{c}=={v}" for c, v in sorted(companions.items())]
        rc, tail = _pip([sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                         "--only-binary=:all:", "--no-deps", "--progress-bar", "off", "--target", tmp, *reqs],
                        log, f"probe {' + '.join(reqs)} on the host's torch {host_torch}", 900)
        if rc != 0:
            return False, f"pip could not fetch {' '.join(reqs)}: {tail.splitlines()[-1] if tail else rc}"
        return probe(host_python, sorted(companions), extra_path=[tmp])


def choose_pair(companions: list[str], host_python: str, host_torch: str | None, compat: dict[str, Any],
                root: Path, log: Log, index: IndexVersions | None = None,
                constraints: list[str] | None = None) -> TorchPair:
    """The torch + companions pair the model runs on, proven by a probe (module docstring). The choice
    is remembered per host torch, companions and pip constraints (``torch-pairs.json`` under ``root``):
    a later port reuses it while its base env still exists."""
    constraints = pip_constraints() if constraints is None else constraints
    memo_key = json.dumps([host_torch, sorted(companions), sorted(constraints), sys.version])
    memo = root / "torch-pairs.json"
    remembered = _recall(memo, memo_key)
    if remembered is not None:
        return remembered
    pair = _choose(companions, host_python, host_torch, compat, root, log, index or pip_index_versions, constraints)
    _remember(memo, memo_key, pair)
    return pair


def _recall(memo: Path, key: str) -> TorchPair | None:
    try:
        raw = json.loads(memo.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(raw, dict):
        return None
    pair = TorchPair(**raw)
    if pair.base_env and not (Path(pair.base_env) / BASE_MARKER).is_file():
        return None  # its base env was removed: choose again
    return pair


def _remember(memo: Path, key: str, pair: TorchPair) -> None:
    with _locked(memo.with_suffix(".lock")):
        try:
            data = json.loads(memo.read_text()) if memo.is_file() else {}
        except ValueError:
            data = {}
        data[key] = pair.as_dict()
        memo.write_text(json.dumps(data, indent=1))


def _choose(companions: list[str], host_python: str, host_torch: str | None, compat: dict[str, Any], root: Path,
            log: Log, index: IndexVersions, constraints: list[str]) -> TorchPair:
    failures: list[str] = []
    have = {c: _host_has(c) for c in companions}
    if host_torch and all(have.values()):
        ok, proof = probe(host_python, companions)
        if ok:
            return TorchPair(torch=host_torch, companions={c: str(v) for c, v in have.items()}, source="host",
                             reason=f"the host's torch {host_torch} and {_fmt(have)} load together", proof=proof)
        failures.append(f"the host's {_fmt(have)} does not load beside its torch {host_torch}: {proof}")
    if host_torch:
        lines = {c: paired_line(c, host_torch, compat) for c in companions}
        same = {c: companion_on_line(c, line, [v for v in index(c) if _allowed(c, v, constraints)])
                for c, line in lines.items() if line}
        if len(same) == len(companions) and all(same.values()):
            chosen = {c: str(v) for c, v in same.items()}
            ok, proof = _try_overlay(chosen, host_torch, host_python, root, log)
            if ok:
                return TorchPair(torch=host_torch, companions=chosen, source="host+index", proof=proof,
                                 reason=f"{_fmt(chosen)} from the package index loads beside the host's torch "
                                        f"{host_torch}", overlay=[f"{c}=={v}" for c, v in sorted(chosen.items())])
            failures.append(f"{_fmt(chosen)} from the package index does not load beside the host's torch "
                            f"{host_torch}: {proof}")
        else:
            failures.append(f"the package index offers no {'/'.join(companions)} release for torch {host_torch}")
    pairs = candidate_pairs(companions, host_torch, index, compat, constraints)
    if host_torch and any("beside the host's torch" in f for f in failures):
        # pip resolves the host's release to the build the host already has (a local wheel, the same index):
        # the companion just failed beside it, so a base env of that release would fail the same way.
        pairs = [p for p in pairs if release_of(p[0]) != release_of(host_torch)]
    for torch_v, chosen in pairs[:MAX_PAIR_ATTEMPTS]:
        try:
            python, proof = ensure_base_env(torch_v, chosen, root, log)
        except EnvBuildError as exc:
            failures.append(f"torch {torch_v} + {_fmt(chosen)}: {str(exc).splitlines()[-1]}")
            continue
        return TorchPair(torch=torch_v, companions=chosen, source="index", proof=proof,
                         reason=f"{'; '.join(failures)}; so the model runs on torch {torch_v} + {_fmt(chosen)}, a "
                                "pair the package index offers, in a base environment of its own",
                         base_env=str(python.parent.parent))
    raise EnvBuildError(f"no torch pair with {', '.join(companions)} loads here: "
                        + ("; ".join(failures) or "the package index offers no pair")
                        + (f"; tried {', '.join(t for t, _ in pairs[:MAX_PAIR_ATTEMPTS])}" if pairs else ""))


def _host_has(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _fmt(versions: dict[str, Any]) -> str:
    return " + ".join(f"{c} {v}" for c, v in sorted(versions.items()) if v) or "none"
