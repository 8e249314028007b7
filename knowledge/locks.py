"""Cross-process locks in the npuport home (fcntl file locks: the kernel drops them when a process
dies). Concurrent ports of a batch serialize their knowledge-base writes with one."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager

from knowledge.home import npuport_home


@contextmanager
def home_lock(name: str, timeout_s: float = 300.0) -> Iterator[None]:
    """Hold ``<home>/locks/<name>.lock`` exclusively; TimeoutError after ``timeout_s``."""
    d = npuport_home() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with (d / f"{name}.lock").open("a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{d / (name + '.lock')} stayed locked for {timeout_s:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
