"""Counters of the decode profile (sandbox/harness/profile.py): monotonic totals of device ops, host syncs and
CPU fallbacks with their call sites in the model, read at every step boundary. On ascend-sim they are
the emulator's own counters; on the CPU only host reads are counted (no op counts, no fallbacks)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def site_in(root: str) -> str | None:
    """The innermost frame in the model's folder, as 'relative/file.py:line' (our own frames are
    outside it, so the walk starts at the caller)."""
    f: Any = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(root):
            rel = _REL.get(fn)
            if rel is None:
                rel = _REL[fn] = os.path.relpath(fn, root)  # relpath costs ~15 us: once per file
            return f"{rel}:{f.f_lineno}"
        f = f.f_back
    return None


_REL: dict[str, str] = {}


def rel_site(site: str, root: str) -> str:
    return os.path.relpath(site, root) if site.startswith(root) else site


class Counters:
    """Monotonic totals of ops, syncs and fallbacks, and their call sites."""

    kind = "time-only"

    def ops(self) -> int:
        return 0

    def syncs(self) -> int:
        return 0

    def fallbacks(self) -> int:
        return 0

    def sync_sites(self) -> dict[str, int]:
        return {}

    def fallback_sites(self) -> dict[str, int]:
        return {}


class SimCounters(Counters):
    kind = "device-ops"  # the emulated runtime counts the device ops it dispatches

    def __init__(self, rt: Any) -> None:
        self.rt = rt

    def ops(self) -> int:
        return int(self.rt.count_ops())

    def syncs(self) -> int:
        return int(self.rt.rec.sync_total)

    def fallbacks(self) -> int:
        return int(self.rt.rec.fallback_total)

    def sync_sites(self) -> dict[str, int]:
        return dict(self.rt.rec.sync_sites)

    def fallback_sites(self) -> dict[str, int]:
        return {f"{op} @ {site}": n for op, sites in self.rt.rec.fallbacks.items() for site, n in sites.items()}


class HostReadCounters(Counters):
    """On the CPU: counts the tensor -> host reads that sync a device (``.item()``, ``.tolist()``,
    ``.numpy()``, ``bool()/int()/float()`` of a tensor) by wrapping those methods during generate.
    No op counts: a TorchDispatchMode would count them, but entering one imports torch._dynamo
    (about 8 s on a 2-core host) and doubles the step time."""

    kind = "cpu-host-reads"
    METHODS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__")

    def __init__(self, root: str) -> None:
        self.root = root
        self.n_syncs = 0
        self.sites: dict[str, int] = {}
        self.saved: dict[str, Any] = {}
        self.reading = False

    def __enter__(self) -> None:
        import torch

        for name in self.METHODS:
            orig = getattr(torch.Tensor, name)
            self.saved[name] = torch.Tensor.__dict__.get(name)
            setattr(torch.Tensor, name, self._counted(orig))

    def __exit__(self, *exc: Any) -> None:
        import torch

        for name, old in self.saved.items():
            if old is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, old)
        self.saved.clear()

    def _counted(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def read(t: Any, *args: Any, **kwargs: Any) -> Any:
            if self.reading:  # a read inside a read (bool() -> item()) is one sync
                return orig(t, *args, **kwargs)
            self.n_syncs += 1
            site = site_in(self.root) or "<outside the model>"
            self.sites[site] = self.sites.get(site, 0) + 1
            self.reading = True
            try:
                return orig(t, *args, **kwargs)
            finally:
                self.reading = False

        return read

    def syncs(self) -> int:
        return self.n_syncs

    def sync_sites(self) -> dict[str, int]:
        return dict(self.sites)


def rel_key(key: str, root: str) -> str:
    op, sep, site = key.rpartition(" @ ")
    return f"{op}{sep}{rel_site(site, root)}"


def diff_sites(now: dict[str, int], before: dict[str, int], root: str) -> dict[str, int]:
    return {rel_key(k, root): v - before.get(k, 0) for k, v in now.items() if v > before.get(k, 0)}
