"""Attacks on npuport's sandbox, git, API and uploads: runs tests/security and counts what held.

    python bench/security.py            # every attack, under bwrap and in process mode where it applies
    python bench/security.py -k git     # a subset (pytest -k expression)
    python bench/security.py --as-user npuport-test   # the same attacks with npuport run by a normal user

Run by root, bwrap is started by root (the usual container: the attacks of test_privilege.py are aimed
at that); ``--as-user`` re-runs this bench under ``runuser`` as that (existing, non-root) user, so an
unprivileged bwrap and service user are attacked the same way. The user needs read access to this
checkout and its interpreter; its NPUPORT_HOME is a fresh folder under /tmp.

Each test of tests/security plants one attack (through a model folder, a patch or an API call) and
asserts it is contained and reported; a passed test is an attack that held, a failed one got through.
Skipped tests are not counted as tried (process mode is declared unisolated, so the guarantees only
bwrap gives are not attacked there; without bwrap the whole bwrap half is skipped). Printed, by class
(test file), tried and held side by side; the figure is LAST. Exits non-zero unless every attack
tried held (and at least one was tried).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="pytest -k expression")
    ap.add_argument("--as-user", default="", help="run the bench as this normal user (runuser; needs root)")
    args = ap.parse_args()
    if args.as_user:
        return _as_user(args.as_user, args.k)
    tally = _Tally()
    argv = [str(REPO / "tests" / "security"), "-q", "-p", "no:cacheprovider", "--no-header", "-rN"]
    if args.k:
        argv += ["-k", args.k]
    rc = pytest.main(argv, plugins=[tally])
    print()
    print(f"{'class':<18} {'tried':>6} {'held':>6} {'skipped':>8}")
    for cls in sorted(set(tally.tried) | set(tally.skipped)):
        print(f"{cls:<18} {tally.tried[cls]:>6} {tally.held[cls]:>6} {tally.skipped[cls]:>8}")
    for nodeid in tally.failed:
        print(f"GOT THROUGH: {nodeid}")
    tried, held = sum(tally.tried.values()), sum(tally.held.values())
    print(f"attacks tried {tried}, held {held}")
    return 0 if tried and tried == held and rc in (0, pytest.ExitCode.OK) else 1


def _as_user(user: str, k: str) -> int:
    """This bench again, as ``user``: its exit status and output are the bench's."""
    import os
    import subprocess
    import tempfile

    if os.geteuid() != 0:
        print("--as-user needs root (runuser)", file=sys.stderr)
        return 2
    home = tempfile.mkdtemp(prefix=f"npuport-bench-{user}-")
    subprocess.run(["chown", user, home], check=True)
    keep = {k_: v for k_, v in os.environ.items() if k_ in ("PATH", "LANG", "LC_ALL", "TERM")}
    argv = ["runuser", "-u", user, "--", "env", "-i", *(f"{k_}={v}" for k_, v in keep.items()),
            f"HOME={home}", f"NPUPORT_HOME={home}/npuport", f"TMPDIR={home}",
            sys.executable, str(Path(__file__).resolve()), *(["-k", k] if k else [])]
    return subprocess.run(argv, cwd=str(REPO)).returncode


if __name__ == "__main__":
    sys.exit(main())
