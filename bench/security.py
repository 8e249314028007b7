"""Attacks on npuport's sandbox, git, API and uploads: runs tests/security and counts what held.

    python bench/security.py            # every attack, under bwrap and in process mode where it applies
    python bench/security.py -k git     # a subset (pytest -k expression)
    python bench/security.py --serve    # the API attacks against a fresh `npuport serve` process, over HTTP
    python bench/security.py --as-user npuport-test --python /srv/npuport/venv/bin/python [--serve]
                                        # the same, with npuport (and its server) run by a normal user

Run by root, bwrap is started by root (the usual container: the attacks of test_privilege.py are aimed
at that); ``--as-user`` re-runs this bench under ``runuser`` as that (existing, non-root) user, so an
unprivileged bwrap and service user are attacked the same way. The user needs an interpreter it can run
with npuport installed (``--python``; root's own is often under a 0700 /root: make a venv from the
system Python under a readable path, docs/security.md) and read access to this checkout; its
NPUPORT_HOME is a fresh folder under /tmp.

``--serve`` starts a real server process (``python -m api.cli serve`` on a free local port, a fresh
NPUPORT_HOME, tokens of its own, a model root with one model) as the user running the bench, waits for
``/healthz``, and runs the API attacks (test_api_attacks.py, test_service_limits.py; ``-k`` widens or
narrows) against it over HTTP (tests/security/conftest.py ``live_server``); the server is stopped at the
end and its exit is checked.

Each test of tests/security plants one attack (through a model folder, a patch or an API call) and
asserts it is contained and reported; a passed test is an attack that held, a failed one got through.
Skipped tests are not counted as tried (process mode is declared unisolated, so the guarantees only
bwrap gives are not attacked there; without bwrap the whole bwrap half is skipped). Printed, by class
(test file, with the issue #29 class it covers), tried and held side by side; the figure is LAST. Exits
non-zero unless every attack tried held (and at least one was tried).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SECURITY = REPO / "tests" / "security"
API_FILES = ("test_api_attacks.py", "test_service_limits.py", "test_manifest_paths.py", "test_shares.py",
             "test_langgraph_dev.py")
# test file -> the class of issue #29 (or the earlier round) it attacks
CLASSES = {
    "privilege": "1 root in bwrap", "run_folder": "2 run folder", "model_outside": "3 model outside",
    "untrusted_source": "3 parser", "restart": "3 crash loop", "sharing": "4 sharing",
    "service_limits": "5 service limits", "honesty": "6 honesty", "api_attacks": "owners/uploads",
    "git_escape": "git", "sandbox_escape": "escape/secrets",
    # issue #42: untrusted files are data, every front door under one policy
    "verify_bundle": "42 verify bundle", "script_injection": "42 scripts", "manifest_paths": "42 manifest paths",
    "langgraph_dev": "42 langgraph dev", "shares": "42 shares/memory", "untrusted_fields": "42 untrusted fields",
}


class _Tally:
    def __init__(self) -> None:
        self.tried: dict[str, int] = defaultdict(int)
        self.held: dict[str, int] = defaultdict(int)
        self.skipped: dict[str, int] = defaultdict(int)
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        cls = Path(report.nodeid.split("::")[0]).stem.removeprefix("test_")
        if report.skipped:
            self.skipped[cls] += 1
        elif report.when == "call":
            self.tried[cls] += 1
            if report.passed:
                self.held[cls] += 1
            else:
                self.failed.append(report.nodeid)
        elif report.failed:  # setup/teardown error: the attack could not be judged held
            self.tried[cls] += 1
            self.failed.append(report.nodeid)


def _run(paths: list[Path], k: str, label: str) -> int:
    tally = _Tally()
    argv = [*map(str, paths), "-q", "-p", "no:cacheprovider", "--no-header", "-rN", "-n", "0"]  # one process: the tally
    if k:
        argv += ["-k", k]
    rc = pytest.main(argv, plugins=[tally])
    print()
    print(f"[{label}]")
    print(f"{'class':<18} {'issue #29 class':<18} {'tried':>6} {'held':>6} {'skipped':>8}")
    for cls in sorted(set(tally.tried) | set(tally.skipped)):
        print(f"{cls:<18} {CLASSES.get(cls, ''):<18} {tally.tried[cls]:>6} {tally.held[cls]:>6} "
              f"{tally.skipped[cls]:>8}")
    for nodeid in tally.failed:
        print(f"GOT THROUGH: {nodeid}")
    tried, held = sum(tally.tried.values()), sum(tally.held.values())
    print(f"attacks tried {tried}, held {held}")
    return 0 if tried and tried == held and rc in (0, pytest.ExitCode.OK) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="pytest -k expression")
    ap.add_argument("--as-user", default="", help="run the bench as this normal user (runuser; needs root)")
    ap.add_argument("--python", default="", help="with --as-user: the interpreter (with npuport) the user runs")
    ap.add_argument("--serve", action="store_true", help="attack a fresh `npuport serve` process over HTTP")
    args = ap.parse_args()
    if args.as_user:
        return _as_user(args.as_user, args.python or sys.executable, args.k, args.serve)
    who = f"uid {os.geteuid()}" + (" (root)" if os.geteuid() == 0 else "")
    if not args.serve:
        return _run([SECURITY], args.k, f"in-process, npuport as {who}")
    with _server() as (url, alive):
        rc = _run([SECURITY / f for f in API_FILES], args.k, f"a fresh `npuport serve` at {url}, run as {who}")
        if not alive():
            print("GOT THROUGH: the server died during the attacks")
            return 1
        return rc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server() -> Iterator[tuple[str, Any]]:
    """A real `npuport serve` process with its own home, tokens and model root: (its URL, whether it is
    still alive) while it runs."""
    import httpx

    sys.path.insert(0, str(REPO / "tests"))
    from security.conftest import SERVE_TOKENS

    base = Path(tempfile.mkdtemp(prefix="npuport-serve-attacks-"))
    home, roots = base / "home", base / "models"
    home.mkdir(mode=0o700)
    (roots / "m1").mkdir(parents=True)
    (roots / "m1" / "npuport.yaml").write_text("name: m1\n")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # the limits the in-process attacks use (tests/test_api.py make_settings), so the same cases apply
    env = {**os.environ, "NPUPORT_HOME": str(home), "NPUPORT_TOKENS": json.dumps(SERVE_TOKENS),
           "NPUPORT_ALLOWED_ROOTS": str(roots), "NPUPORT_WORKERS": "2", "NPUPORT_BODY_TIMEOUT_S": "1.0",
           "NPUPORT_MAX_BODY_BYTES": str(64 * 1024), "NPUPORT_MAX_UPLOAD_BYTES": str(256 * 1024),
           "NPUPORT_MAX_EXTRACTED_BYTES": str(512 * 1024), "NPUPORT_SERVE": "0", "NPUPORT_KB": "off"}
    log = (base / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            cwd=str(base), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit("npuport serve exited "
                                 f"({proc.returncode}):\n{(base / 'server.log').read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("npuport serve did not answer /healthz within 300 s")
            time.sleep(0.5)
        os.environ.update(NPUPORT_TEST_SERVE_URL=url, NPUPORT_TEST_SERVE_HOME=str(home),
                          NPUPORT_TEST_SERVE_ROOTS=str(roots))
        yield url, lambda: proc.poll() is None
    finally:
        for k in ("NPUPORT_TEST_SERVE_URL", "NPUPORT_TEST_SERVE_HOME", "NPUPORT_TEST_SERVE_ROOTS"):
            os.environ.pop(k, None)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        print(f"npuport serve stopped (exit {proc.returncode}); its log: {base / 'server.log'}")
        shutil.rmtree(home, ignore_errors=True)


def _as_user(user: str, python: str, k: str, serve: bool) -> int:
    """This bench again, as ``user`` with ``python``: its exit status and output are the bench's."""
    if os.geteuid() != 0:
        print("--as-user needs root (runuser)", file=sys.stderr)
        return 2
    check = subprocess.run(["runuser", "-u", user, "--", python, "-c", "import sandbox, api, pytest"],
                           capture_output=True, text=True, cwd=str(REPO))
    if check.returncode != 0:
        print(f"{user} cannot run npuport with {python}: {check.stderr.strip()[-500:]}\n"
              "make an interpreter it can run (docs/security.md, 'A non-root service user') and pass --python",
              file=sys.stderr)
        return 2
    home = tempfile.mkdtemp(prefix=f"npuport-bench-{user}-")
    subprocess.run(["chown", user, home], check=True)
    keep = {k_: v for k_, v in os.environ.items() if k_ in ("PATH", "LANG", "LC_ALL", "TERM")
            or k_.startswith("PIP_")}
    parent = _delegate_cgroups(user)
    argv = ["runuser", "-u", user, "--", "env", "-i", *(f"{k_}={v}" for k_, v in keep.items()),
            f"HOME={home}", f"NPUPORT_HOME={home}/npuport", f"TMPDIR={home}",
            *([f"NPUPORT_CGROUP_PARENT={parent}"] if parent else []),
            python, str(Path(__file__).resolve()), *(["-k", k] if k else []), *(["--serve"] if serve else [])]
    return subprocess.run(argv, cwd=str(REPO)).returncode


def _delegate_cgroups(user: str) -> str:
    """What an operator does for a service user (docs/security.md): a pids and a memory cgroup folder it owns,
    named to npuport by NPUPORT_CGROUP_PARENT, so its runs get a process cap and a memory cap as root's do."""
    name = f"npuport-{user}"
    made = False
    for controller in ("pids", "memory"):
        mount = Path("/sys/fs/cgroup") / controller
        if not (mount / "cgroup.procs").exists():
            mount = Path("/sys/fs/cgroup")  # cgroup v2: one folder for both
        folder = mount / name
        with contextlib.suppress(OSError):
            folder.mkdir(exist_ok=True)
            if mount == Path("/sys/fs/cgroup"):  # v2: its children get the controllers
                (folder / "cgroup.subtree_control").write_text("+pids +memory")
            subprocess.run(["chown", "-R", user, str(folder)], check=True)
            made = True
    return name if made else ""


if __name__ == "__main__":
    sys.exit(main())
