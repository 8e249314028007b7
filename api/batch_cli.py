"""`npuport batch`: the live progress table and the final results table (the driver is graph.batch)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from knowledge.errors import exit_code

STYLE = {"queued": "dim", "running": "cyan", "validated": "bold green", "failed": "bold red"}


def progress_table(view: Any) -> Group:
    table = Table(title=f"batch {view.batch_id} on {view.executor} ({view.workers} at once)", expand=False)
    for col in ("model", "status", "attempts", "time", "sandbox runs", "reason"):
        table.add_column(col)
    now = time.time()
    for p in view.ports:
        res = p.result or {}
        took = (p.finished or now) - p.started if p.started is not None else None
        table.add_row(p.key, Text(p.status, style=STYLE.get(p.status, "")), str(p.attempts),
                      f"{took:.0f}s" if took is not None else "-", str(res.get("sandbox_runs", "-")),
                      (p.reason or "")[:80])
    counts = {s: sum(1 for p in view.ports if p.status == s) for s in STYLE}
    eta = view.eta_s()
    summary = (f"{counts['queued']} queued, {counts['running']} running, {counts['validated']} validated, "
               f"{counts['failed']} failed; elapsed {now - view.started:.0f}s, ETA "
               + ("-" if eta is None else f"{eta:.0f}s"))
    return Group(table, Text(summary))


def run_batch_cli(manifest: Path, overrides: dict[str, Any], *, executor: str, ray_address: str | None,
                  workers: int | None, retry_failed: bool, out: Path | None, console: Console, err: Console) -> int:
    from graph.batch.manifest import load_manifest
    from graph.batch.runner import BatchOptions, run_batch
    from knowledge.errors import BatchBusy, BatchManifestError, ExecutorError

    try:
        resolved = load_manifest(manifest, overrides)
    except BatchManifestError as exc:
        err.print(f"[bold red]error:[/] invalid batch manifest:\n{escape(str(exc))}")
        return exit_code(exc)
    console.print(f"[bold]npuport batch[/] {resolved.name}: {len(resolved.ports)} models (batch {resolved.batch_id})")
    from api.cli_port import disk_warning

    disk_warning()
    live = Live(console=console, refresh_per_second=2, transient=False) if console.is_terminal else None

    def update(view: Any) -> None:
        if live is not None:
            live.update(progress_table(view))

    opts = BatchOptions(executor=executor, ray_address=ray_address, workers=workers,  # type: ignore[arg-type]
                        retry_failed=retry_failed, out_dir=out, on_update=update)
    try:
        if live is not None:
            live.start()
        result = run_batch(resolved, opts)
    except (ExecutorError, BatchBusy) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        return exit_code(exc)
    finally:
        if live is not None:
            live.stop()
    if result.skipped:  # a rerun of the same manifest: finished ports are kept, not run again
        console.print(f"skipped {len(result.skipped)} port(s) an earlier run of this batch finished: "
                      f"{escape(', '.join(result.skipped))} (--retry-failed runs the failed ones again)")
    _final_table(result, console)
    return 0 if result.ok else 1


def _final_table(result: Any, console: Console) -> None:
    import json

    rows = json.loads(result.files["json"].read_text())["ports"]
    table = Table(title=f"batch {result.batch_id}")
    for col in ("model", "target", "verdict", "runs", "time (s)", "hazards found/fixed", "speedup", "bundle",
                "failure reason"):
        table.add_column(col)
    for r in rows:
        speed = f"{r['speedup']:.2f}x" if isinstance(r.get("speedup"), int | float) else "-"
        table.add_row(r["model"], str(r["target"]), Text(r["verdict"], style=STYLE.get(r["verdict"], "")),
                      str(r["sandbox_runs"]), f"{r['time_s']:.1f}" if isinstance(r.get("time_s"), int | float) else "-",
                      f"{r['hazards_found']}/{r['hazards_fixed']}", speed, r["bundle"] or "-", r["reason"] or "")
    console.print(table)
    for r in rows:  # shared learning: what each port taught the memory, and what it reused from it
        if r.get("learned"):
            console.print(f"{escape(r['model'])} learned: {escape(', '.join(r['learned']))}")
        if r.get("reused"):
            console.print(f"{escape(r['model'])} reused: {escape(', '.join(r['reused']))}")
    n_ok = sum(r["verdict"] == "validated" for r in rows)
    console.print(f"{n_ok} of {len(rows)} validated; results: {result.files['csv']}, {result.files['json']}, "
                  f"{result.files['md']}")
