"""The CLI's live display: one line, redrawn in place, of what the port is doing right now."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

# A pipe or a file gets whole lines (never hard-wrapped at 80 columns) and tables at a wide width; a
# terminal, or an explicit COLUMNS, keeps rich's wrapping to its width.
_PIPED = not sys.stdout.isatty() and "COLUMNS" not in os.environ
console = Console(highlight=False, soft_wrap=_PIPED, width=200 if _PIPED else None)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # one-line errors stay greppable


def fmt_params(params: dict[str, Any] | None) -> str:
    """{'batch': 4, 'dtype': 'bf16'} -> 'batch=4 dtype=bf16'."""
    return " ".join(f"{k}={v}" for k, v in (params or {}).items() if v is not None) or "-"


class LiveStatus:
    """What the port is doing right now: rendered four times a second by rich.Live, so the elapsed
    time moves even while one agent works for minutes (a native build, a tuning trial)."""

    def __init__(self, max_runs: int, tune_trials: int | None) -> None:
        self.t0 = time.time()
        self.agent = "starting"
        self.agent_t0 = self.t0
        self.max_runs = max_runs
        self.port_runs = 0
        self.reference_runs = 0
        self.trial: tuple[int, int] | None = None
        self.tune_trials = tune_trials
        self.best: tuple[float, dict[str, Any]] | None = None
        self.spinner = Spinner("dots")
        self.in_run = False
        self.phase = ""

    def elapsed(self) -> float:
        return time.time() - self.t0

    def on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "task":
            self.agent, self.agent_t0 = str(data.get("node")), time.time()
            self.in_run = self.agent == "executor"
            self.phase = ""
        elif kind == "counters":
            self.in_run = False  # the executor's update: its run is counted now
            self.port_runs = int(data.get("port_runs", self.port_runs))
            self.reference_runs = int(data.get("reference_runs", self.reference_runs))
        elif kind == "trial_start":
            self.trial = (int(data["k"]), int(data["n"]))
        elif kind == "phase":
            self.phase = str(data.get("text") or "")
        elif kind == "trial_done":
            value = data.get("value")
            if value is not None and (self.best is None or value > self.best[0]):
                self.best = (float(value), dict(data.get("params") or {}))

    def line(self) -> Text:
        t = Text()
        t.append(f"{self.elapsed():6.1f}s ", style="dim")
        t.append(f"{self.agent:<12}", style="bold cyan")
        t.append(f" {time.time() - self.agent_t0:5.1f}s")
        run_n = self.port_runs + (1 if self.in_run else 0)
        t.append(f"  sandbox run {run_n}/{self.max_runs}")
        if self.trial:
            t.append(f"  trial {self.trial[0]}/{self.trial[1]}")
        if self.best:
            t.append(f"  best {self.best[0]:.1f} tok/s ({fmt_params(self.best[1])})")
        if self.phase:
            t.append(f"  {self.phase}")
        t.no_wrap, t.overflow = True, "ellipsis"  # one line at any width: it is redrawn in place
        return t

    def __rich__(self) -> Table:
        grid = Table.grid(padding=(0, 1))
        grid.add_row(self.spinner, self.line())
        return grid
