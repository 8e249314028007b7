"""Running one port from the CLI: the live display, the closing summary, and the one interrupt path.

Ctrl-C: the first press asks the run to stop (knowledge/interrupt.py: no new sandbox or tuning trial
starts, the running sandbox is killed), keeps the thread's checkpoint, and exits 130 with the command
that resumes it; a second press exits at once. A resume (``npuport resume THREAD``) continues from
the last checkpoint, so the agent that was interrupted runs again from its start.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from rich.live import Live
from rich.table import Table
from rich.text import Text

from agents.state import (
    bundle_of,
    counters_of,
    failure_of,
    findings_of,
    numerics_of,
    patches_of,
    perf_of,
    reason_of,
    status_of,
    tuning_of,
)
from api.cli_live import LiveStatus, console, err, fmt_params
from knowledge.errors import exit_code, first_line
from knowledge.interrupt import PortInterrupted, clear_stop, request_stop
from knowledge.settings import set_environment, settings

EXIT_OK, EXIT_NOT_VALIDATED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_NOT_VERIFIED = 4
EXIT_MEANINGS: dict[int, str] = {
    EXIT_OK: "the port validated",
    EXIT_NOT_VALIDATED: "the port ran but did not validate",
    EXIT_BAD_INPUT: "bad input or usage",
    EXIT_INTERNAL: "internal error",
    EXIT_NOT_VERIFIED: "not verified",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
"""Every exit code of every command, with the words that open its row in `--help`, the README's table
and docs/cli.md (tests/test_cli_inputs.py holds them to these)."""
STOP_GRACE_S = 15.0
"""After the first Ctrl-C, the longest the run may take to stop before the process exits anyway."""


def resume_command(thread_id: str) -> str:
    return f"npuport resume {thread_id}"


@contextmanager
def interrupt_path(thread_id: str, again: str | None = None) -> Iterator[None]:
    """SIGINT during a port: first press stops the run (PortInterrupted in the main thread, the stop
    flag for work in other threads), second press, or a run that does not stop within STOP_GRACE_S,
    ends the process at once with 130. The previous handler is restored afterwards."""
    presses = 0
    timers: list[threading.Timer] = []

    def hard_exit(why: str) -> None:
        err.print(f"{why}; " + (again or f"the checkpoint is kept. Resume with: {resume_command(thread_id)}"))
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)  # noqa: SLF001 - the user asked to leave now: no cleanup waits

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            hard_exit("interrupted again: exiting now")
        request_stop()
        err.print("[bold yellow]interrupt:[/] stopping the port (running sandboxes are killed; "
                  "press Ctrl-C again to exit at once)")
        timer = threading.Timer(STOP_GRACE_S, hard_exit, args=(f"the port did not stop within {STOP_GRACE_S:.0f}s",))
        timer.daemon = True
        timer.start()
        timers.append(timer)
        raise PortInterrupted("interrupted by the user")

    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    clear_stop()
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        for timer in timers:  # the port stopped: the grace timer must not end the process later
            timer.cancel()


HEARTBEAT_S = 30.0
"""On a pipe (no live line) a line says what the port is doing at least this often."""


def print_step(event: dict[str, Any], t0: float) -> None:
    console.print(Text.assemble((f"{time.time() - t0:6.1f}s ", "dim"), (f"{event['agent']:<12}", "bold cyan"),
                                " ", str(event["summary"])))


class Heartbeat:
    """Lines for a pipe or a log, where rich draws no live line: a named phase when it starts (the deployment's
    env, start, tokens, throughput), and what the port is doing whenever HEARTBEAT_S passed without a line."""

    def __init__(self, status: LiveStatus) -> None:
        self.status = status
        self.last = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Heartbeat:
        if not console.is_terminal:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()

    def printed(self) -> None:
        self.last = time.monotonic()

    def phase(self, node: str, text: str) -> None:
        console.print(Text.assemble((f"{self.status.elapsed():6.1f}s ", "dim"), (f"{node:<12}", "bold cyan"), " ",
                                    text))
        self.printed()

    def _loop(self) -> None:
        while not self.done.wait(min(1.0, HEARTBEAT_S / 3)):
            if time.monotonic() - self.last >= HEARTBEAT_S:
                console.print(self.status.line())
                self.printed()


def print_summary(state: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    counters = counters_of(state)
    numerics = numerics_of(state)
    bundle = bundle_of(state)
    tuning = tuning_of(state)
    table.add_row("findings", str(len(findings_of(state))))
    table.add_row("patches", str(len(patches_of(state))))
    table.add_row("sandbox runs", f"{counters.port_runs} port + {counters.reference_runs} reference")
    table.add_row("validation", numerics.verdict if numerics else "not-run")
    if tuning.best:
        table.add_row("tuned", fmt_params(tuning.best))
        if tuning.tuned.get("chosen"):  # the final benchmark's verdict, in the report's words (slower is said)
            table.add_row("throughput", tuning.detail)
    perf = perf_of(state)
    if perf.get("profiled"):
        from agents.validation.perf_evidence import shown_where

        found = perf.get("pathologies") or []
        table.add_row("performance", ("1 pathology" if len(found) == 1 else f"{len(found)} pathologies") + "".join(
            f"\n  {p['title']} at {shown_where(p)}" for p in found))
    report = Path(bundle.dir) / "report.json" if bundle.dir else None
    record = json.loads(report.read_text()).get("deployment") if report is not None and report.is_file() else None
    if record:  # the exercised deployment (agents/report/deployment.py), or why it has not run
        from agents.deploy.serve_report import deployment_summary

        table.add_row("deployment", deployment_summary(record).replace("BUNDLE", bundle.dir))
    table.add_row("bundle", bundle.dir or "-")
    print_table(table)


def print_table(table: Table) -> None:
    """A table on a terminal; on a pipe or in a log its rows as whole lines (docs/cli.md: a cell is never cut
    or wrapped there), the cells of a row separated by two spaces after a padded first column."""
    if console.is_terminal:
        console.print(table)
        return
    cells = [[c.plain if isinstance(c, Text) else str(c) for c in col.cells] for col in table.columns]
    first = max((len(c) for c in cells[0]), default=0) if cells else 0
    for row in zip(*cells, strict=True):
        head, *rest = row
        lines = "  ".join(rest).splitlines() or [""]
        console.print(f"{head:<{first}}  {lines[0]}", markup=False, highlight=False, soft_wrap=True)
        for more in lines[1:]:
            console.print(f"{'':<{first}}  {more}", markup=False, highlight=False, soft_wrap=True)


def isolation_fallback() -> None:
    """The CLI ports the user's own model: without bubblewrap it may run it unisolated, but says so loudly."""
    from sandbox.isolation.process import bwrap_available

    choice = settings().isolation_choice
    if choice == "process":
        err.print("[bold yellow]warning:[/] --isolation process: the model's code runs UNISOLATED "
                  "(it can read and write what you can)")
    elif choice == "auto" and bwrap_available() is None:
        err.print("[bold yellow]warning:[/] bubblewrap (bwrap) is not available: the model's code runs UNISOLATED "
                  "(it can read and write what you can). Install bubblewrap, or pass NPUPORT_ISOLATION=process "
                  "to silence this.")
        set_environment({"NPUPORT_ALLOW_UNISOLATED": "1"})


def disk_warning() -> None:
    """A port writes environments and shrunk checkpoints under NPUPORT_HOME: say before it starts when the disk is
    nearly full (a full disk fails later as something else: torch.save's "unexpected pos", a silent pip)."""
    from knowledge.disk import low_disk_note
    from knowledge.home import npuport_home

    if note := low_disk_note(npuport_home()):
        err.print(f"[bold yellow]warning:[/] {note}: a port of a real release may need more "
                  "(layered environments, workspaces); free some space or set NPUPORT_HOME elsewhere.")


def run_port_cli(request: dict[str, Any], goal: str = "", thread_id: str | None = None) -> int:
    """Run one port (or, with ``thread_id``, resume that thread from its checkpoint) with the live
    display; returns the exit code: 0 validated, 130 interrupted, else the failure's kind
    (knowledge/errors.py: 2 a user's error, 3 a bug or a broken host) or 1 (not validated)."""
    from agents.request import new_run_id, request_of
    from graph.runner import run_port

    req = request_of(request)  # the flags as typed; the goal may still fill what they left out
    resuming = thread_id is not None
    thread = thread_id or new_run_id(req.model_path or "model")
    isolation_fallback()
    disk_warning()
    where = req.target if "target" in request else "the goal's target"
    console.print(f"[bold]npuport[/] {'resume' if resuming else 'port'} {req.model_path} -> {where} (thread {thread})")
    status = LiveStatus(req.max_runs, req.tune_trials if req.tune else None)

    beat = Heartbeat(status)

    def on_event(kind: str, data: dict[str, Any]) -> None:
        status.on_event(kind, data)
        if kind == "phase" and data.get("node") == "deployer":  # a named phase: a line on a terminal too
            beat.phase("deployer", str(data.get("text") or ""))
        if kind == "trial_done":
            beat.printed()  # one line per trial survives the live line (and shows in logs)
            value = data.get("value")
            console.print(Text.assemble((f"{status.elapsed():6.1f}s ", "dim"), ("tuner       ", "bold cyan"),
                                        f" trial {data.get('k')}/{data.get('n')} {fmt_params(data.get('params'))}: ",
                                        f"{value:.1f} tok/s" if value is not None
                                        else str(data.get("reason") or data.get("outcome", "failed"))))

    inputs = None if resuming else {"goal": goal, "request": request}
    try:
        with interrupt_path(thread), Live(status, console=console, refresh_per_second=4, transient=True), beat:
            # transient: the live line disappears at the end; on a non-terminal rich prints nothing for it
            state = run_port(inputs, thread, on_step=lambda e: (print_step(e, status.t0), beat.printed()),
                             on_event=on_event)
    except KeyboardInterrupt:
        err.print(f"interrupted: stopped after {status.elapsed():.1f}s in {status.agent}; the checkpoint of "
                  f"thread {thread} is kept in $NPUPORT_HOME/checkpoints.sqlite")
        err.print(f"resume with: {resume_command(thread)}", soft_wrap=True)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug or a broken host: one line, and where the state is kept
        err.print(f"[bold red]error:[/] the port stopped unexpectedly: {type(exc).__name__}: {first_line(exc)} "
                  f"(thread {thread}; checkpoints in $NPUPORT_HOME/checkpoints.sqlite; "
                  f"retry with: {resume_command(thread)})")
        return EXIT_INTERNAL
    print_summary(state)
    if status_of(state) == "validated":
        from agents.validation.perf_evidence import verdict

        numerics = numerics_of(state)
        words = verdict("validated", perf_of(state), numerics.coverage if numerics else None)
        console.print(f"[bold {'yellow' if 'partial' in words else 'green'}]{words}[/]: {reason_of(state)}")
        return EXIT_OK
    from agents.report.bundle import NOT_PORTED, outcome_label

    label = outcome_label(state)
    err.print(f"[bold {'red' if label == NOT_PORTED else 'yellow'}]{label}:[/] {reason_of(state) or 'unknown reason'}")
    failure = failure_of(state)
    return exit_code(failure.kind) if failure is not None and failure.kind else EXIT_NOT_VALIDATED


def run_deploy_cli(bundle: Path, report: dict[str, Any], bench: bool) -> int:
    """`npuport deploy BUNDLE` / `npuport bench BUNDLE`: the deployment phase on a bundle, its phases as lines;
    0 when vLLM served the port and its tokens passed, 1 otherwise, 130 interrupted (the bundle stands)."""
    from agents.deploy.serve_report import deployment_summary
    from agents.report.deployment import run_deployment

    status = LiveStatus(0, None)
    status.agent = "deployer"
    beat = Heartbeat(status)
    console.print(f"[bold]npuport[/] {'bench' if bench else 'deploy'} {bundle}", soft_wrap=True)
    try:
        with interrupt_path(str(bundle), f"the bundle stands: `npuport deploy {bundle}` runs the check again"), beat:
            record = run_deployment({}, bundle, bench=bench, on_phase=lambda text: (
                status.on_event("phase", {"text": text}), beat.phase("deployer", text)))
    except KeyboardInterrupt:
        err.print(f"interrupted: the bundle {bundle} stands; run `npuport deploy {bundle}` again to check its "
                  "deployment", soft_wrap=True)
        return EXIT_INTERRUPTED
    console.print(f"deployment: {deployment_summary(record)}", soft_wrap=True)
    console.print(f"bundle: {bundle} (deployment.json, report.md)", soft_wrap=True)
    return EXIT_OK if record.get("status") == "served" else EXIT_NOT_VALIDATED
