"""The ``npuport`` command line (typer + rich).

Exit codes (one table for every command; also in ``npuport --help`` and the README):

  0  the port validated (its greedy tokens equal the original's; a model without generate: its forward
     outputs within the stated tolerance), or the command did its job
  1  the port ran but did not validate (the report says why), or a check the command ran failed
  2  bad input or usage: not a folder, an empty folder, no Python files, unknown chip or target (in a
     flag or in the goal text), a Python file that does not parse or decode, --target npu without
     torch_npu, an earlier bundle in --out without --force, an --out folder npuport did not write;
     nothing is run and no bundle is written
  3  internal error: npuport itself broke (a bug or a broken host); the checkpoint is kept
  4  not verified (`verify`): a claim the bundle makes could not be checked here (its target is not on this
     host, the original is not the one it was ported from, the report is not of npuport's shape)
130  interrupted (Ctrl-C): running sandboxes are killed, the checkpoint is kept and `npuport resume THREAD`
     continues it; a second Ctrl-C (or a port that has not stopped 15 s after the first) exits at once
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from api.cli_inputs import (
    clear_out_dir,
    goal_problem,
    model_folder_problem,
    out_dir_problem,
    sources_problem,
    target_problem,
)
from api.cli_kb import kb_app
from api.cli_live import LiveStatus, console, err, fmt_params
from api.cli_options import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_NOT_VALIDATED,
    EXIT_OK,
    TargetOpt,
    check_chip,
    check_target,
    fail,
    one_of,
    with_request_options,
)
from api.cli_port import EXIT_INTERRUPTED, EXIT_MEANINGS, EXIT_NOT_VERIFIED, print_table, run_port_cli
from api.cli_project import project
from api.cli_scan import ops, scan
from knowledge.settings import set_environment
from sandbox.targets import DEFAULT_CHIP, DEFAULT_TARGET, EMULATED_TARGET

__all__ = ["EXIT_INTERRUPTED", "LiveStatus", "app", "fmt_params", "run_port_cli"]
_EXIT_DETAIL = {EXIT_OK: " (or the command succeeded)", EXIT_NOT_VALIDATED: " (or a check the command ran failed)",
                EXIT_BAD_INPUT: " (nothing run, no bundle written)", EXIT_INTERNAL: " (the checkpoint is kept)",
                EXIT_NOT_VERIFIED: " (`verify`: a claim of the bundle could not be checked here)",
                EXIT_INTERRUPTED: ", the checkpoint kept: `npuport resume THREAD` continues"}
EXIT_TABLE = "Exit codes: " + "; ".join(f"{code} {text}{_EXIT_DETAIL[code]}"
                                         for code, text in EXIT_MEANINGS.items()) + "."


if not os.isatty(1) and "COLUMNS" not in os.environ:  # piped help: whole option texts, as every other line
    import typer.rich_utils

    typer.rich_utils.MAX_WIDTH = typer.rich_utils.MAX_WIDTH or 200

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help=f"Port PyTorch models to Huawei Ascend NPUs.\n\n{EXIT_TABLE}",
                  epilog="Configuration: NPUPORT_* environment variables, listed by `npuport settings`.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("npuport")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        console.print(f"npuport {v}", markup=False)
        raise typer.Exit(EXIT_OK)


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """Port PyTorch models to Huawei Ascend NPUs."""


@app.command()
def settings() -> None:
    """Every NPUPORT_* environment variable: its default and what it sets (knowledge/settings.py)."""
    from knowledge.settings import env_table

    table = Table(show_header=True, box=None, pad_edge=False)
    table.add_column("variable", no_wrap=True)  # a name is copied whole, however narrow the terminal
    for col in ("default", "meaning"):
        table.add_column(col, overflow="fold")
    for var, default, doc in env_table():
        table.add_row(var, default or "-", doc)
    print_table(table)

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"

def _checked_out_dir(out: Path | None, model: Path, force: bool) -> Path:
    out = out or Path.cwd() / "npuport-out" / model.resolve().name
    if problem := out_dir_problem(out, model, force):
        raise fail(problem)
    return out


@app.command()
@with_request_options
def port(
    path: Annotated[Path, typer.Argument(help="the model folder (never written)")],
    goal: Annotated[str, typer.Option(help="goal text, e.g. 'to Ascend 910B, maximise throughput' (flags win)")] = "",
    out: Annotated[Path | None, typer.Option("--out", "-o",
                                             help="bundle folder (default ./npuport-out/<model>)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an earlier npuport bundle in --out (a folder of "
                                        "other files is refused, never emptied)")] = False,
    isolation: Annotated[str, typer.Option(metavar="[auto|bwrap|process]",
                                           help="auto | bwrap | process (process: the model's code runs "
                                                "UNISOLATED; auto falls back to it with a warning)")] = "auto",
    **fields: Any,
) -> None:
    """Port the model in PATH to the target and write a bundle.

    Exit 0 validated, 1 not, 2 bad input, 3 internal error, 130 interrupted (Ctrl-C keeps the checkpoint
    and prints the `npuport resume THREAD` that continues it).

    The original folder is never written. Bad input (not a folder, empty, no Python files, unknown chip or
    target) is refused before anything runs. The request's options (--target, --chip, the budgets, ...) are
    agents/request.py's PortRequest fields (api/cli_options.py ``with_request_options``)."""
    if isolation not in ("auto", "bwrap", "process"):
        raise fail(f"--isolation must be auto, bwrap or process, not {isolation!r}")
    if isolation != "auto":
        set_environment({"NPUPORT_ISOLATION": isolation})
    if problem := model_folder_problem(path) or (goal_problem(goal) if goal else None) or sources_problem(path):
        raise fail(problem)
    out_dir = _checked_out_dir(out, path, force)
    request = {"model_path": str(path), "out_dir": str(out_dir), **fields}
    # the goal text fills only what no flag set explicitly (typer gives defaults, so the goal may pick a
    # field only when its flag was left at its default)
    ctx = click_context()
    if goal and ctx is not None:
        for name in fields:
            if ctx.get_parameter_source(name).name == "DEFAULT":  # type: ignore[union-attr]
                request.pop(name)
    if problem := target_problem(str(request["target"] if "target" in request else _goal_target(goal, path))):
        raise fail(problem)
    if force:  # last: only once every check passed, and only npuport's own bundle (out_dir_problem)
        clear_out_dir(out_dir)
    raise typer.Exit(run_port_cli(request, goal=goal))


def _goal_target(goal: str, model: Path) -> str:
    from agents.request import parse_goal

    return parse_goal(goal, {"model_path": str(model)}).target if goal else DEFAULT_TARGET


@app.command()
def resume(
    thread: Annotated[str | None, typer.Argument(help="the thread id an interrupted (or failed) port printed; "
                                                      "without one, the threads a resume would continue")] = None,
) -> None:
    """Continue an interrupted port from its last checkpoint (the agent that was stopped runs again);
    exit codes as for `port`, 130 when interrupted again. Without THREAD: list the resumable threads."""
    from graph.jobs_support import checkpoint_db, thread_snapshot
    from graph.runner import FINISHED, resumable, thread_infos

    if thread is None:
        infos = thread_infos()
        if not infos:
            console.print(f"no port to resume in {checkpoint_db()} (is NPUPORT_HOME the same?)", soft_wrap=True)
            raise typer.Exit(EXIT_OK)
        table = Table(show_header=True, box=None, pad_edge=False)
        for col in ("thread", "model", "stopped in", "last checkpoint"):
            table.add_column(col, no_wrap=col == "thread")
        for info in infos:
            table.add_row(info.thread_id, info.model, info.stopped_in, info.updated)
        print_table(table)
        console.print("resume one with: npuport resume THREAD", soft_wrap=True)
        raise typer.Exit(EXIT_OK)
    snap = thread_snapshot(thread) if checkpoint_db().is_file() else None
    if snap is None:
        raise fail(f"no checkpoint of thread {thread!r} in {checkpoint_db()} (is NPUPORT_HOME the same?)")
    from agents.state import bundle_of, request_fields_of, status_of

    status = status_of(snap.values)
    if not resumable(snap):
        bundle = bundle_of(snap.values).dir or "-"
        if status not in FINISHED:  # nothing left to run and no verdict: say so, never "finished (running)"
            raise fail(f"thread {thread} stopped with nothing left to run and no verdict (status {status or 'none'}); "
                       "port the model again", EXIT_NOT_VALIDATED)
        console.print(f"thread {thread} already finished ({status}); its bundle: {bundle}", soft_wrap=True)
        raise typer.Exit(EXIT_OK if status == "validated" else EXIT_NOT_VALIDATED)
    raise typer.Exit(run_port_cli(request_fields_of(snap.values), thread_id=thread))


@app.command()
def deploy(
    bundle: Annotated[Path, typer.Argument(help="a validated bundle written by `npuport port`")],
    bench: Annotated[bool, typer.Option("--bench", help="the full side-by-side throughput comparison (every "
                                        "concurrency, Transformers batched) instead of the budgeted probe")] = False,
) -> None:
    """Run (or rerun) the deployment check on a bundle: vLLM serves the port with the bundle's serve.sh, its
    tokens are checked against Transformers and its throughput probed; deployment.json and the report's
    Deployment section are written into the bundle. Exit 0 served, 1 not served."""
    raise typer.Exit(_deploy_cli(bundle, bench))


@app.command(name="bench")
def bench_cmd(
    bundle: Annotated[Path, typer.Argument(help="a validated bundle written by `npuport port`")],
) -> None:
    """The deployment check with the full side-by-side throughput comparison: vLLM at concurrency 1, 8 and 32
    against Transformers one request at a time and batched (`npuport deploy BUNDLE --bench`)."""
    raise typer.Exit(_deploy_cli(bundle, True))


def _deploy_cli(bundle: Path, bench: bool) -> int:
    from api.cli_port import run_deploy_cli

    if not (bundle / "report.json").is_file():
        raise fail(f"{bundle} is not a bundle (no report.json)")
    report = json.loads((bundle / "report.json").read_text())
    if report.get("status") != "validated":
        raise fail(f"{bundle} holds a port that did not validate ({report.get('status')}): there is nothing to serve")
    return run_deploy_cli(bundle, report, bench)


def click_context() -> Any:
    import click

    return click.get_current_context(silent=True)


@app.command()
def demo(
    target: TargetOpt = EMULATED_TARGET,
    out: Annotated[Path | None, typer.Option("--out", "-o")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an earlier npuport bundle in --out")] = False,
    tune_trials: Annotated[int, typer.Option(help="budget: tuning trials")] = 4,
    verify_after: Annotated[bool, typer.Option("--verify/--no-verify",
                                               help="end with `npuport verify` of the bundle")] = True,
) -> None:
    """Port the bundled example examples/ocr_mini (a CUDA-only OCR-style model) to the emulated Ascend target,
    then verify the bundle (re-apply, re-validate, re-benchmark) as the report suggests."""
    model = EXAMPLES_DIR / "ocr_mini"
    if not model.is_dir():
        raise fail(f"the example model is missing at {model}", EXIT_INTERNAL)
    out_dir = _checked_out_dir(out, model, force)
    if force:
        clear_out_dir(out_dir)
    request = {"model_path": str(model), "target": target, "chip": DEFAULT_CHIP, "tune": True,
               "tune_trials": tune_trials,
               "out_dir": str(out_dir)}
    code = run_port_cli(request, goal="")
    if code == EXIT_OK and verify_after:
        # the demo's numbers must survive its own suggested check: verify runs here, as a user would
        from agents.deploy import verify_bundle

        console.print(f"\n[bold]npuport verify {out_dir} --original {model}[/] (re-apply the patch, re-validate, "
                      "re-benchmark)",
                      soft_wrap=True)
        res = verify_bundle(out_dir, model)
        for line in res.lines():
            console.print(line, soft_wrap=True, markup=False)
        code = _demo_verdict(res, code)
    if code == EXIT_OK:
        console.print("\n[bold]next:[/]")
        for cmd, what in ((f"less {out_dir / 'report.md'}", "the report: findings, patches, numerics, tuning"),
                          (f"npuport verify {out_dir} --original {model}",
                           "re-apply the patch and re-validate in fresh sandboxes"),
                          ("npuport scan path/to/your_model", "hazards in your own model, file:line"),
                          ("npuport port path/to/your_model --target ascend-sim", "port it"),
                          ("npuport serve", "the web page and HTTP API (it prints its URL and token)")):
            console.print(f"  {cmd}", soft_wrap=True, markup=False)  # never wrapped: it gets copied
            console.print(f"      [dim]{what}[/]")
    raise typer.Exit(code)


def _demo_verdict(res: Any, code: int) -> int:
    """The demo's exit code after its verify: a disagreement fails it; a claim a busy host cannot check (a
    throughput whose runs spread too far to compare) is said, in yellow, and fails it only when the port's tokens
    were not re-checked and agreed (the demo's one claim a host cannot blame on its load)."""
    if res.agree:
        return code
    tokens_agree = any(c.name == "tokens match" and c.verdict == "agree" for c in res.claims)
    if res.outcome == "not verified" and tokens_agree:
        unchecked = ", ".join(c.name for c in res.claims if c.verdict == "unchecked")
        err.print(f"[bold yellow]verify: not verified[/]: {unchecked} could not be checked on this host (see the lines "
                  "above); the port's tokens were re-checked and agree")
        return code
    err.print(f"[bold red]verify: {res.outcome}[/] (the demo's report; see the lines above)")
    return EXIT_NOT_VALIDATED


app.command()(scan)
app.command()(ops)
app.command()(project)
app.add_typer(kb_app, name="kb")


@app.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="a bundle folder written by `npuport port`")],
    original: Annotated[Path, typer.Option(help="the original model folder the bundle was ported from (required: "
                                                "verify never takes it from the bundle's report)")],
    tolerance: Annotated[float, typer.Option(help="relative throughput tolerance")] = 0.3,
) -> None:
    """Re-apply the bundle's patch to the original in a fresh workspace, re-run validation and the
    benchmark in fresh sandboxes, and print agree / disagree per claim. Exit 0 when every claim the bundle
    makes agrees, 1 when one disagrees, 4 (not verified) when one could not be checked here."""
    from agents.deploy import verify_bundle

    if not (bundle / "report.json").is_file():
        raise fail(f"{bundle} is not a bundle (no report.json)", 2)
    if not original.is_dir():
        raise fail(f"--original {original} is not a folder", 2)
    res = verify_bundle(bundle, original, tolerance=tolerance)
    for line in res.lines():
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"verify: {res.outcome}", markup=False)
    raise typer.Exit({"agree": 0, "disagree": 1}.get(res.outcome, EXIT_NOT_VERIFIED))


@app.command()
def batch(
    manifest: Annotated[Path, typer.Argument(help="a batch manifest (YAML), or a folder of model folders/archives")],
    executor: Annotated[str, typer.Option(help="ray (embedded local Ray, or --ray-address) | local (processes)",
                                          metavar="[ray|local]",
                                          callback=one_of(lambda: ("ray", "local"), "executor"))] = "ray",
    ray_address: Annotated[str | None, typer.Option("--ray-address", envvar="RAY_ADDRESS",
                                                    help="an existing Ray cluster (default: embedded local "
                                                         "Ray)")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="ports at once (default: the CPUs Ray sees)")] = None,
    retry_failed: Annotated[bool, typer.Option(help="run failed ports of this batch again")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o",
                                             help="results folder (default ./npuport-out/<batch>)")] = None,
    target: Annotated[str | None, typer.Option("--target", "-t", help="override every model's target")] = None,
    chip: Annotated[str | None, typer.Option("--chip", help="override every model's chip")] = None,
) -> None:
    """Port many models at once (one port each: own workspace, sandbox, bundle); resumable: running the
    same manifest again skips finished ports. Writes results.csv, results.json and report.md."""
    from api.batch_cli import run_batch_cli

    if target is not None:
        check_target(target)
    if chip is not None:
        check_chip(chip)
    raise typer.Exit(run_batch_cli(manifest, {"target": target, "chip": chip}, executor=executor,
                                   ray_address=ray_address, workers=workers, retry_failed=retry_failed, out=out,
                                   console=console, err=err))


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show the configured LLM endpoint (NPUPORT_LLM_*, key masked) and check that it answers
    (GET /models and a one-token chat call). Exit 1 when an endpoint is configured but does not answer;
    with none configured, npuport uses its offline rules (exit 0)."""
    from agents.llm.doctor import check_llm

    res = check_llm()
    if as_json:
        console.print_json(json.dumps({**res.model_dump(), "ok": res.ok}, default=str))
    else:
        table = Table(title="LLM endpoint (NPUPORT_LLM_*)", show_header=False)
        for k, v in res.settings.items():
            table.add_row(k, str(v))
        print_table(table)
        if not res.configured:
            console.print("no LLM is configured (set NPUPORT_LLM_BASE_URL and NPUPORT_LLM_MODEL): "
                          "every agent uses the offline rules")
        for p in res.probes:
            console.print(f"{'ok  ' if p.ok else 'FAIL'} {p.name} ({p.seconds:.2f}s): {p.detail}")
    raise typer.Exit(0 if res.ok or not res.configured else 1)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    model_root: Annotated[list[Path] | None, typer.Option("--model-root", help="a folder whose model folders the chat "
                                                          "and the API may port by path (repeatable; default "
                                                          "NPUPORT_ALLOWED_ROOTS)")] = None,
) -> None:
    """Serve the HTTP API (ports, events, chat completions) and the web page."""
    from api.serve import serve as _serve

    _serve(host, port, roots=model_root)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
