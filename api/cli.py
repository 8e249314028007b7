"""The ``npuport`` command line (typer + rich).

Exit codes: 0 only for a validated port (or a successful command); 1 for a port that did not
validate (one-line reason); 2 for bad input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Port PyTorch models to Huawei Ascend NPUs.")
ops_app = typer.Typer(no_args_is_help=True, help="Op inventory of a model, and op-support matrices of torch_npu builds.")
console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"

TargetOpt = Annotated[str, typer.Option("--target", "-t", help="cpu | ascend-sim | npu | auto")]
ChipOpt = Annotated[str, typer.Option("--chip", help="910b | a3 | 310p")]


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def _print_step(event: dict[str, Any], t0: float) -> None:
    console.print(f"[dim]{time.time() - t0:6.1f}s[/] [bold cyan]{event['agent']:<12}[/] {event['summary']}")


def _summary(state: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    findings = state.get("findings") or []
    patches = state.get("patches") or []
    runs = state.get("runs") or []
    counters = state.get("counters") or {}
    numerics = state.get("numerics") or {}
    bundle = state.get("bundle") or {}
    table.add_row("findings", str(len(findings)))
    table.add_row("patches", str(len(patches)))
    table.add_row("sandbox runs", f"{counters.get('port_runs', 0)} port + {counters.get('reference_runs', 0)} reference")
    table.add_row("validation", str(numerics.get("verdict", "not-run")))
    table.add_row("bundle", str(bundle.get("dir", "-")))
    console.print(table)
    del runs


def run_port_cli(request: dict[str, Any], goal: str = "") -> int:
    from agents.planner import new_run_id
    from graph.runner import run_port

    thread_id = new_run_id(request.get("model_path") or "model")
    t0 = time.time()
    console.print(f"[bold]npuport[/] port {request.get('model_path')} -> {request.get('target')} (thread {thread_id})")
    state = run_port({"goal": goal, "request": request}, thread_id, on_step=lambda e: _print_step(e, t0))
    _summary(state)
    if state.get("status") == "validated":
        console.print(f"[bold green]validated[/]: {state.get('reason')}")
        return 0
    err.print(f"[bold red]not ported:[/] {state.get('reason', 'unknown reason')}")
    return 1


@app.command()
def port(
    path: Annotated[Path, typer.Argument(help="the model folder (never written)")],
    target: TargetOpt = "auto",
    chip: ChipOpt = "910b",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="bundle folder")] = None,
    torch_npu: Annotated[str, typer.Option("--torch-npu", help="torch_npu version to emulate")] = "2.13.0",
    strict: Annotated[bool, typer.Option(help="fail on CPU fallbacks (TORCH_NPU_FALLBACK_CPU_DISABLE=1)")] = False,
    max_runs: Annotated[int, typer.Option(help="budget: sandbox runs of the port")] = 8,
    max_wall: Annotated[float, typer.Option(help="budget: wall time in seconds")] = 1800.0,
    run_timeout: Annotated[float, typer.Option(help="wall-clock limit of one sandbox run, seconds")] = 300.0,
) -> None:
    """Port the model in PATH to the target; writes a bundle; exit 0 only when validated."""
    if not path.exists():
        raise _fail(f"model path {path} does not exist", 1)
    request = {"model_path": str(path), "target": target, "chip": chip, "out_dir": str(out) if out else None,
               "torch_npu": torch_npu, "strict": strict, "max_runs": max_runs, "max_wall_s": max_wall,
               "run_timeout_s": run_timeout}
    raise typer.Exit(run_port_cli(request))


@app.command()
def demo(
    target: TargetOpt = "ascend-sim",
    out: Annotated[Path | None, typer.Option("--out", "-o")] = None,
) -> None:
    """Port the bundled example examples/ocr_mini (a CUDA-only OCR-style model) to the emulated Ascend target."""
    model = EXAMPLES_DIR / "ocr_mini"
    if not model.is_dir():
        raise _fail(f"the example model is missing at {model}")
    request = {"model_path": str(model), "target": target, "chip": "910b",
               "out_dir": str(out or Path.cwd() / "npuport-out" / "ocr_mini")}
    raise typer.Exit(run_port_cli(request, goal=""))


@app.command()
def scan(
    path: Annotated[Path, typer.Argument(help="the model folder")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Static hazard scan (H1-H11) with file:line evidence, and the model's entry."""
    from agents.entry import EntryNotFound, discover_entry
    from agents.scanner import scan_tree

    if not path.is_dir():
        raise _fail(f"{path} is not a folder", 1)
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
            "entry": entry,
            "entry_error": entry_error,
        }
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
        return
    table = Table(title=f"hazards in {path}")
    for col in ("hazard", "where", "category", "severity", "what"):
        table.add_column(col)
    for f in result.findings:
        table.add_row(f.hazard, f"{f.file}:{f.line}", str(f.category), str(f.severity), f.message)
    console.print(table)
    for e in result.parse_errors:
        err.print(f"[red]parse error:[/] {e}")
    console.print(f"entry: {entry if entry else entry_error}")


@ops_app.command("matrix")
def ops_matrix(
    torch_npu: Annotated[str, typer.Option("--torch-npu", help="torch_npu version, e.g. 2.13.0")] = "2.13.0",
    wheel: Annotated[Path | None, typer.Option(help="a local torch_npu .whl instead of downloading")] = None,
    yaml: Annotated[list[Path] | None, typer.Option("--yaml", help="op-plugin op_plugin_functions yaml")] = None,
    rebuild: Annotated[bool, typer.Option(help="rebuild even if a stored matrix exists")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Build the op-support matrix of a torch_npu build from its wheel (and op-plugin yaml) and summarise it."""
    from knowledge import op_matrix

    try:
        matrix = op_matrix.load_or_build(torch_npu, wheel=wheel, yaml_paths=list(yaml or []), rebuild=rebuild)
    except Exception as exc:
        raise _fail(f"cannot build the matrix for torch_npu {torch_npu}: {str(exc).splitlines()[0]}", 1) from exc
    if as_json:
        sys.stdout.write(json.dumps(matrix.summary(), indent=1, default=str) + "\n")
    else:
        console.print(op_matrix.format_summary(matrix))


app.add_typer(ops_app, name="ops")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
