"""Counters of one emulated run: ops, fallbacks, dtype events, host syncs, per step."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_SANDBOX_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP_PREFIXES = (_TORCH_DIR, _SANDBOX_DIR)


def call_site(depth: int = 2) -> str:
    """Innermost frame outside torch and outside sandbox/, as 'file:line'."""
    f: FrameType | None = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_SKIP_PREFIXES) and not fn.startswith("<frozen"):
            return f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>:0"


@dataclass
class Step:
    label: str
    ops0: int
    fallbacks0: int
    syncs0: int


@dataclass
class Recorder:
    # Per-op counts live on the op decisions (hot path); the device module installs these two views.
    count_ops: Callable[[], int] = lambda: 0
    op_counts: Callable[[], dict[str, int]] = dict
    fallback_total: int = 0
    fallbacks: dict[str, dict[str, int]] = field(default_factory=dict)  # op -> site -> n
    fallback_warned: set[str] = field(default_factory=set)
    sync_total: int = 0
    sync_sites: dict[str, int] = field(default_factory=dict)
    dtype_events: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    double_warned: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    current: Step | None = None

    def sync(self, kind: str, depth: int = 3) -> None:
        self.sync_total += 1
        site = call_site(depth)
        self.sync_sites[site] = self.sync_sites.get(site, 0) + 1

    def fallback(self, op: str, depth: int = 3) -> None:
        self.fallback_total += 1
        site = call_site(depth)
        sites = self.fallbacks.setdefault(op, {})
        sites[site] = sites.get(site, 0) + 1

    def dtype_event(self, kind: str, op: str, dtype: str, depth: int = 3) -> None:
        key = (kind, op, dtype, call_site(depth))
        self.dtype_events[key] = self.dtype_events.get(key, 0) + 1

    def begin_step(self, label: str) -> None:
        if self.current is not None:
            self.end_step()
        self.current = Step(label, self.count_ops(), self.fallback_total, self.sync_total)

    def end_step(self) -> None:
        s = self.current
        if s is None:
            return
        self.steps.append(
            {
                "label": s.label,
                "ops": self.count_ops() - s.ops0,
                "fallbacks": self.fallback_total - s.fallbacks0,
                "host_syncs": self.sync_total - s.syncs0,
            }
        )
        self.current = None

    def report(self) -> dict[str, Any]:
        npu_ops = self.op_counts()
        return {
            "npu_ops": dict(sorted(npu_ops.items())),
            "op_total": sum(npu_ops.values()),
            "fallbacks": {
                op: {"count": sum(sites.values()), "sites": dict(sites)}
                for op, sites in sorted(self.fallbacks.items())
            },
            "dtype_events": [
                {"kind": k, "op": op, "dtype": dt, "site": site, "count": n}
                for (k, op, dt, site), n in self.dtype_events.items()
            ],
            "host_syncs": {"total": self.sync_total, "sites": dict(self.sync_sites)},
            "steps": list(self.steps),
            "warnings": list(self.warnings),
        }
