"""`npuport scan` and `npuport ops`: what a model folder holds before anything is ported."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from api.cli_inputs import model_folder_problem
from api.cli_live import console, err, fmt_params
from api.cli_options import EXIT_BAD_INPUT, ChipOpt, TargetOpt, fail
from knowledge.errors import exit_code, first_line
from sandbox.targets import DEFAULT_CHIP, DEFAULT_TORCH_NPU, EMULATED_TARGET


def _fmt_entry(entry: dict[str, Any]) -> list[str]:
    lines = [f"  class   {entry.get('entry', {}).get('class', '-')}"]
    for key in ("config", "inputs", "decode"):
        if entry.get(key):
            lines.append(f"  {key:<7} {entry[key]}")
    run = entry.get("run") or {}
    kwargs = " ".join(f"{k}={v}" for k, v in (run.get("kwargs") or {}).items())
    lines.append(f"  run     {run.get('method', '-')}({kwargs})" + (f", step {run['step']}" if run.get("step") else ""))
    if entry.get("shrink"):
        lines.append(f"  shrink  {fmt_params(entry['shrink'])}")
    return lines


_SCAN_CATEGORY = {"blocks running": 0, "changes numbers": 1, "slows down": 2}
_SCAN_SEVERITY = {"high": 0, "medium": 1, "low": 2}


def _scan_rank(f: Any) -> tuple[Any, ...]:
    """Blockers first: what stops the model running, then what changes its numbers, then what slows it."""
    return (_SCAN_CATEGORY.get(str(f.category), 3), _SCAN_SEVERITY.get(str(f.severity), 3), f.file, f.line)


def _scan_summary(findings: list[Any]) -> str:
    by = {c: sum(1 for f in findings if str(f.category) == c) for c in _SCAN_CATEGORY}
    files = len({f.file for f in findings})
    # no folder in it: the user named it, and a long path would push the line past 80 columns
    return (f"{len(findings)} hazards in {files} file(s): {by['blocks running']} block running, "
            f"{by['changes numbers']} change numbers, {by['slows down']} slow it down")


def scan(
    path: Annotated[Path, typer.Argument(help="the model folder")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Static hazard scan (every hazard class in agents/rules/) with file:line evidence, and the model's entry.

    Exit 2 when the folder is not a model folder or a file does not parse."""
    from agents.reading.entry import discover_entry
    from agents.reading.scanner import scan_tree
    from knowledge.errors import EntryNotFound

    if problem := model_folder_problem(path):
        raise fail(problem)
    from sandbox.isolation.source_check import check_sources

    unreadable = [p for p in check_sources(path) if p.kind == "encoding"]  # syntax errors: parse_errors
    result = scan_tree(path)
    try:
        entry: dict[str, Any] | None = discover_entry(path).as_manifest_dict()
        entry_error = ""
    except EntryNotFound as exc:
        entry, entry_error = None, str(exc)
    if as_json:
        payload = {
            "findings": [f.model_dump(mode="json") for f in result.findings],
            "parse_errors": [str(e) for e in result.parse_errors],
            "source_problems": [str(p) for p in unreadable],
            "entry": entry,
            "entry_error": entry_error,
        }
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
    else:
        ordered = sorted(result.findings, key=_scan_rank)
        console.print(f"[bold]{_scan_summary(result.findings)}[/]", soft_wrap=True)  # one line
        for f in ordered:
            # the location is never cut: it heads its own line; the message wraps below it
            console.print(Text.assemble((f"{f.hazard:<4}", "bold"), (f"{f.file}:{f.line}", "cyan"),
                                        (f"  {f.category}, {f.severity}", "dim")), overflow="ignore", crop=False)
            console.print(Padding(Text(f.message), (0, 0, 0, 4), expand=False))
        for e in result.parse_errors:
            err.print(f"[red]parse error:[/] {e}")
        for p in unreadable:
            err.print(f"[red]unreadable:[/] {p}")
        console.print("[bold]entry[/]")
        console.print(Group(*(Text(line) for line in _fmt_entry(entry))) if entry else Text(f"  {entry_error}"))
    if result.parse_errors or unreadable:
        raise typer.Exit(EXIT_BAD_INPUT)


def ops(
    what: Annotated[str, typer.Argument(help="a model folder, or 'matrix' to build a torch_npu op-support matrix")],
    target: TargetOpt = EMULATED_TARGET,
    chip: ChipOpt = DEFAULT_CHIP,
    torch_npu: Annotated[str, typer.Option("--torch-npu", help="torch_npu version")] = DEFAULT_TORCH_NPU,
    strict: Annotated[bool, typer.Option(help="raise on CPU fallbacks (TORCH_NPU_FALLBACK_CPU_DISABLE=1)")] = False,
    wheel: Annotated[Path | None, typer.Option(help="matrix: a local torch_npu .whl instead of downloading")] = None,
    yaml: Annotated[list[Path] | None,
                    typer.Option("--yaml", help="matrix: op-plugin op_plugin_functions yaml")] = None,
    rebuild: Annotated[bool, typer.Option(help="matrix: rebuild even if a stored matrix exists")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Op inventory of a model on the target (NPU kernels, CPU fallbacks with call sites, dtype problems,
    host syncs per step), or `ops matrix`: the op-support matrix of a torch_npu build."""
    if what == "matrix":
        _ops_matrix(torch_npu, wheel, list(yaml or []), rebuild, as_json)
        return
    model = Path(what)
    if not model.is_dir():
        raise fail(f"{model} is not a model folder (or say 'matrix')")
    from agents.environment.inventory import op_inventory
    from knowledge.errors import EntryNotFound, TargetError

    try:
        inv = op_inventory(model, target=target, chip=chip, torch_npu=torch_npu, strict=strict)
    except EntryNotFound as exc:
        raise fail(f"cannot find how to run the model: {exc}", exit_code(exc)) from exc
    except TargetError as exc:
        raise fail(str(exc), exit_code(exc)) from exc
    if as_json:
        sys.stdout.write(json.dumps(inv.as_dict(), indent=1, default=str) + "\n")
    else:
        _print_inventory(inv.as_dict())
    if not inv.ok:
        raise typer.Exit(1)


def _print_inventory(inv: dict[str, Any]) -> None:
    st = inv["op_stats"] or {}
    console.print(f"[bold]op inventory[/] on {inv['target']} ({inv['reason']})")
    console.print(f"chip {st.get('chip', '-')}, torch_npu {st.get('torch_npu', '-')}, matrix {st.get('matrix', '-')}")
    if not inv["ok"]:
        err.print(f"[red]the model failed on the target:[/] {inv['error']}")
    npu_ops = st.get("npu_ops") or {}
    console.print(f"ops with NPU kernels: {len(npu_ops)} distinct, {st.get('op_total', sum(npu_ops.values()))} calls")
    fb = st.get("fallbacks") or {}
    table = Table(title="CPU fallbacks")
    for col in ("op", "calls", "call sites"):
        table.add_column(col)
    for op, info in sorted(fb.items()):
        sites = ", ".join(f"{k} x{v}" for k, v in (info.get("sites") or {}).items())
        table.add_row(op, str(info.get("count", "")), sites)
    console.print(table if fb else "CPU fallbacks: none")
    for ev in st.get("dtype_events") or []:
        console.print(f"dtype: {ev.get('kind')} {ev.get('op')} {ev.get('dtype')} at {ev.get('site')} "
                      f"x{ev.get('count', 1)}")
    syncs = st.get("host_syncs") or {}
    console.print(f"host syncs: {syncs.get('total', 0)} in all")
    for site, n in sorted((syncs.get("sites") or {}).items(), key=lambda kv: -kv[1]):
        console.print(f"  {site} x{n}")
    steps = st.get("steps") or []
    if steps:
        per = [s.get("host_syncs", 0) for s in steps]
        console.print(f"per step ({len(steps)} steps): ops {steps[0].get('ops')}, host syncs {per}, "
                      f"fallbacks {[s.get('fallbacks', 0) for s in steps]}")


def _ops_matrix(torch_npu: str, wheel: Path | None, yaml: list[Path], rebuild: bool, as_json: bool) -> None:
    from knowledge import op_matrix
    from knowledge.matrix_compare import format_summary

    try:
        matrix = op_matrix.load_or_build(torch_npu, wheel=wheel, yaml_paths=yaml, rebuild=rebuild)
    except Exception as exc:
        raise fail(f"cannot build the matrix for torch_npu {torch_npu}: {first_line(exc)}", exit_code(exc)) from exc
    if as_json:
        sys.stdout.write(json.dumps(matrix.summary(), indent=1, default=str) + "\n")
    else:
        console.print(format_summary(matrix))
