"""Untrusted source is parsed first in a child process with time, memory and stack limits.

npuport parses a model's files in its own process (libcst for the scan and the codemods, ast for the
entry, the environment and the bundle). libcst's native parser overflows its stack on 100 KB of
``-`` and takes the process down (a server with every owner's jobs); a crafted file can hold the
GIL for tens of seconds. ``source_problem`` parses every ``.py`` of a folder the way npuport will
(``ast.parse`` and ``libcst.parse_module``), in a child, file by file: a child that dies, runs out of
time or memory names the file, and the port is refused before npuport's own process reads it.
Files that passed are remembered by content digest, so the same source is checked once per process.

Syntax errors are not this guard's business: the child reports them as parsed (the scanner says
where the error is, as before); only what would hurt the parent counts.

Run as ``python -I -m sandbox.isolation.parse_guard`` with a JSON list of paths on stdin (the child side).
"""

from __future__ import annotations

import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

MAX_FILE_BYTES = 8 * 1024 * 1024  # one source file; real modeling files are well under 1 MiB
MAX_FILES = 5000
TIMEOUT_S = 60.0  # the whole folder (a 2,000-line model parses in about a second)
MEMORY_MB = 2048
STACK_MB = 64  # the parsers recurse; the default 8 MiB is not what bounds them, the rlimit is

_known_good: set[str] = set()


def _limits() -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_MB * mb, MEMORY_MB * mb))
    resource.setrlimit(resource.RLIMIT_STACK, (STACK_MB * mb, STACK_MB * mb))
    cpu = int(TIMEOUT_S) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py")
                  if not any(part.startswith(".") for part in p.relative_to(folder).parts) and p.is_file()
                  and not p.is_symlink())


def source_problem(folder: Path, *, timeout_s: float = TIMEOUT_S) -> str | None:
    """Why npuport must not parse ``folder``'s Python files in its own process, or None."""
    files = _sources(folder)
    if len(files) > MAX_FILES:
        return f"{folder} has {len(files)} Python files; npuport reads at most {MAX_FILES}"
    todo: list[tuple[Path, str]] = []
    for p in files:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            return f"{p.relative_to(folder)} is {size} bytes; a source file may be at most {MAX_FILE_BYTES}"
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        if digest not in _known_good:
            todo.append((p, digest))
    if not todo:
        return None
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-I", "-m", "sandbox.isolation.parse_guard"],
                              input=json.dumps([str(p) for p, _ in todo]), capture_output=True, text=True,
                              timeout=timeout_s, preexec_fn=_limits)  # noqa: PLW1509 - limits in the child
        out, failed = done.stdout, done.returncode != 0
        why = f"the parser died (exit {done.returncode})"
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        failed, why = True, f"parsing took over {timeout_s:g} s"
    parsed = set(out.splitlines())
    for p, digest in todo:
        if str(p) in parsed:
            _known_good.add(digest)
        elif failed:
            return (f"{p.relative_to(folder)}: {why} after {time.monotonic() - t0:.1f} s; npuport will not parse "
                    "this file in its own process")
    return None if not failed else f"{folder}: {why}"


def _child() -> int:
    import ast
    import contextlib
    import warnings

    import libcst

    warnings.simplefilter("ignore")
    for path in json.loads(sys.stdin.read()):
        source = Path(path).read_text(encoding="utf-8", errors="replace")
        for parse in (ast.parse, libcst.parse_module):
            with contextlib.suppress(Exception):  # a syntax error is the scanner's to report; a crash is ours
                parse(source)
        print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
