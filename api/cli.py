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
console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"

TARGETS = ("cpu", "ascend-sim", "npu", "auto")
CHIPS = ("910b", "a3", "310p")


def _one_of(choices: tuple[str, ...], what: str):  # type: ignore[no-untyped-def]
    def check(value: str) -> str:
        if value not in choices:
            raise typer.BadParameter(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
        return value

    return check


TargetOpt = Annotated[str, typer.Option("--target", "-t", help="cpu | ascend-sim | npu | auto",
                                         callback=_one_of(TARGETS, "target"))]
ChipOpt = Annotated[str, typer.Option("--chip", help="910b | a3 | 310p", callback=_one_of(CHIPS, "chip"))]


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
    perf = state.get("perf") or {}
    if perf.get("profiled"):
        found = perf.get("pathologies") or []
        table.add_row("performance", ("1 pathology" if len(found) == 1 else f"{len(found)} pathologies") + "".join(
            f"\n  {p['title']} at {p.get('where') or '?'}" for p in found))
    table.add_row("bundle", str(bundle.get("dir", "-")))
    console.print(table)
    del runs


def run_port_cli(request: dict[str, Any], goal: str = "") -> int:
    from agents.planner import new_run_id
    from graph.runner import run_port

    thread_id = new_run_id(request.get("model_path") or "model")
    t0 = time.time()
    console.print(f"[bold]npuport[/] port {request.get('model_path')} -> {request.get('target')} (thread {thread_id})")
    try:
        state = run_port({"goal": goal, "request": request}, thread_id, on_step=lambda e: _print_step(e, t0))
    except Exception as exc:  # a bug or a broken host: one line, and where the state is kept
        err.print(f"[bold red]error:[/] the port stopped unexpectedly: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                  f"(thread {thread_id}; checkpoints in $NPUPORT_HOME/checkpoints.sqlite)")
        return 1
    _summary(state)
    if state.get("status") == "validated":
        from agents.perf_evidence import verdict

        console.print(f"[bold green]{verdict('validated', state.get('perf'))}[/]: {state.get('reason')}")
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
    strict_perf: Annotated[bool, typer.Option("--strict-perf", help="fail the port on performance pathologies "
                                              "in its decode profile (no KV cache, per-step syncs, ...)")] = False,
    max_runs: Annotated[int, typer.Option(help="budget: sandbox runs of the port")] = 8,
    max_wall: Annotated[float, typer.Option(help="budget: wall time in seconds")] = 1800.0,
    tune: Annotated[bool, typer.Option(help="benchmark and tune the validated port (minutes on a small host)")] = False,
    tune_trials: Annotated[int, typer.Option(help="budget: tuning trials")] = 12,
    run_timeout: Annotated[float, typer.Option(help="wall-clock limit of one sandbox run, seconds")] = 300.0,
) -> None:
    """Port the model in PATH to the target; writes a bundle; exit 0 only when validated."""
    if not path.exists():
        raise _fail(f"model path {path} does not exist", 1)
    request = {"model_path": str(path), "target": target, "chip": chip, "out_dir": str(out) if out else None,
               "torch_npu": torch_npu, "strict": strict, "strict_perf": strict_perf, "max_runs": max_runs, "max_wall_s": max_wall,
               "run_timeout_s": run_timeout, "tune": tune, "tune_trials": tune_trials}
    raise typer.Exit(run_port_cli(request))


@app.command()
def demo(
    target: TargetOpt = "ascend-sim",
    out: Annotated[Path | None, typer.Option("--out", "-o")] = None,
    tune_trials: Annotated[int, typer.Option(help="budget: tuning trials")] = 4,
) -> None:
    """Port the bundled example examples/ocr_mini (a CUDA-only OCR-style model) to the emulated Ascend target."""
    model = EXAMPLES_DIR / "ocr_mini"
    if not model.is_dir():
        raise _fail(f"the example model is missing at {model}")
    request = {"model_path": str(model), "target": target, "chip": "910b", "tune": True, "tune_trials": tune_trials,
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


@app.command()
def ops(
    what: Annotated[str, typer.Argument(help="a model folder, or 'matrix' to build a torch_npu op-support matrix")],
    target: TargetOpt = "ascend-sim",
    chip: ChipOpt = "910b",
    torch_npu: Annotated[str, typer.Option("--torch-npu", help="torch_npu version, e.g. 2.13.0")] = "2.13.0",
    strict: Annotated[bool, typer.Option(help="raise on CPU fallbacks (TORCH_NPU_FALLBACK_CPU_DISABLE=1)")] = False,
    wheel: Annotated[Path | None, typer.Option(help="matrix: a local torch_npu .whl instead of downloading")] = None,
    yaml: Annotated[list[Path] | None, typer.Option("--yaml", help="matrix: op-plugin op_plugin_functions yaml")] = None,
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
        raise _fail(f"{model} is not a model folder (or say 'matrix')", 1)
    from agents.entry import EntryNotFound
    from agents.inventory import op_inventory
    from sandbox.targets import TargetError

    try:
        inv = op_inventory(model, target=target, chip=chip, torch_npu=torch_npu, strict=strict)
    except EntryNotFound as exc:
        raise _fail(f"cannot find how to run the model: {exc}", 1) from exc
    except TargetError as exc:
        raise _fail(str(exc), 2) from exc
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
        console.print(f"dtype: {ev.get('kind')} {ev.get('op')} {ev.get('dtype')} at {ev.get('site')} x{ev.get('count', 1)}")
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

    try:
        matrix = op_matrix.load_or_build(torch_npu, wheel=wheel, yaml_paths=yaml, rebuild=rebuild)
    except Exception as exc:
        raise _fail(f"cannot build the matrix for torch_npu {torch_npu}: {str(exc).splitlines()[0]}", 1) from exc
    if as_json:
        sys.stdout.write(json.dumps(matrix.summary(), indent=1, default=str) + "\n")
    else:
        console.print(op_matrix.format_summary(matrix))


kb_app = typer.Typer(no_args_is_help=True, help="The knowledge base: torch_npu / CANN docs, recipes, port memory.")


def _kb_errors() -> tuple[type[BaseException], ...]:
    from knowledge.kb import KBError

    return (KBError,)


@kb_app.command("build")
def kb_build_cmd(
    source: Annotated[list[str] | None, typer.Option("--source", "-s", help="a docs folder, wheel:VERSION, matrix:PATH ...")] = None,
    rebuild: Annotated[bool, typer.Option(help="drop the store and build it anew")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Ingest sources into the Chroma store (incremental: unchanged sources cost nothing)."""
    from knowledge.kb.cli_support import kb_build

    try:
        out = kb_build(list(source or []), json=as_json, rebuild=rebuild)
    except _kb_errors() as exc:
        raise _fail(str(exc), 1) from exc
    sys.stdout.write((json.dumps(out, indent=1, default=str) if as_json else str(out)) + "\n")


@kb_app.command("search")
def kb_search_cmd(
    query: Annotated[str, typer.Argument(help="an error message, op name or question")],
    k: Annotated[int, typer.Option("--k", help="number of hits")] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Op-aware search: identifiers filter first, dense search fills the rest; hits carry citations."""
    from knowledge.kb.cli_support import kb_search

    try:
        out = kb_search(query, k=k, json=as_json)
    except _kb_errors() as exc:
        raise _fail(str(exc), 1) from exc
    sys.stdout.write((json.dumps(out, indent=1, default=str, ensure_ascii=False) if as_json else str(out)) + "\n")


@kb_app.command("stats")
def kb_stats_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What the store holds."""
    from knowledge.kb.cli_support import kb_stats

    try:
        out = kb_stats(json=as_json)
    except _kb_errors() as exc:
        raise _fail(str(exc), 1) from exc
    sys.stdout.write((json.dumps(out, indent=1, default=str) if as_json else str(out)) + "\n")


app.add_typer(kb_app, name="kb")


@app.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="a bundle folder written by `npuport port`")],
    original: Annotated[Path | None, typer.Option(help="the original model (default: the path in report.json)")] = None,
    tolerance: Annotated[float, typer.Option(help="relative throughput tolerance")] = 0.3,
) -> None:
    """Re-apply the bundle's patch to the original in a fresh workspace, re-run validation and the
    benchmark in fresh sandboxes, and print agree / disagree per claim."""
    from agents.deploy import verify_bundle

    if not (bundle / "report.json").is_file():
        raise _fail(f"{bundle} is not a bundle (no report.json)", 2)
    res = verify_bundle(bundle, original, tolerance=tolerance)
    for line in res.lines():
        console.print(line)
    raise typer.Exit(0 if res.agree else 1)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
) -> None:
    """Serve the HTTP API (ports, events, chat completions) and the web page."""
    from api.serve import serve as _serve

    _serve(host, port)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
