"""`npuport project`: the deployment of a port (a bundle) or of a model folder projected on the chip the user
named: output tok/s (total and per card), TTFT and TPOT per concurrency with the bound that decides each,
the weights' memory, the KV cache per request and the largest concurrency that fits (agents/projection)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from api.cli_inputs import model_folder_problem
from api.cli_live import console
from api.cli_options import check_chip, choices_metavar, fail
from knowledge.errors import NpuportError, exit_code, first_line
from sandbox.targets import chip_names


def _concurrency(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"--concurrency {value!r}: comma-separated whole numbers, e.g. 1,8,32,100") from None
    if not levels or min(levels) < 1:
        raise typer.BadParameter(f"--concurrency {value!r}: each level at least 1")
    return levels


def project(
    path: Annotated[Path, typer.Argument(help="a port's bundle (its report.json) or a model folder")],
    chip: Annotated[str | None, typer.Option("--chip", metavar=choices_metavar(chip_names), callback=check_chip,
                                             help="the Ascend chip (default: the bundle's, else the default "
                                                  "chip)")] = None,
    cards: Annotated[int | None, typer.Option("--cards", min=1, help="tensor-parallel size (default: the fewest "
                                              "cards that hold the model)")] = None,
    concurrency: Annotated[str, typer.Option("--concurrency",
                                             help="concurrent requests, comma-separated")] = "1,8,32,100",
    input_len: Annotated[int | None, typer.Option("--input-len", min=1, help="prompt tokens per request (default "
                                                  "1024, within the model's length)")] = None,
    output_len: Annotated[int | None, typer.Option("--output-len", min=1, help="output tokens per request "
                                                   "(default 256)")] = None,
    graph_mode: Annotated[bool, typer.Option("--graph-mode/--eager", help="ACL graph capture (vLLM's default) or "
                                             "eager, as the published setting used")] = True,
    dtype: Annotated[str | None, typer.Option("--dtype", help="bfloat16 | float16 | int8 (W8A8) | int4 (4-bit "
                                              "weights); default: the chip's serving dtype")] = None,
    build_env: Annotated[bool, typer.Option("--build-env/--no-build-env", help="build the model's environment when "
                                            "it is not built yet (minutes, once) so its own code is read")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the projection as JSON")] = False,
) -> None:
    """Project serving throughput, latency and memory of the full-size model on an Ascend chip.

    Exit 2 on a path that is neither a bundle nor a model folder, an unknown chip, or a dtype the chip has no
    published peak for."""
    from agents.projection.model_source import from_bundle, from_folder
    from agents.projection.projector import default_workload, project_source
    from agents.projection.render import text

    levels = _concurrency(concurrency)
    bundle = (path / "report.json").is_file()
    if not bundle and (problem := model_folder_problem(path)):
        raise fail(problem)
    try:
        source = from_bundle(path) if bundle else from_folder(path)
        if not source.config:
            raise fail(f"{source.model_dir} has no readable config.json: nothing to project")
        from agents.projection.model_source import model_cost

        cost = model_cost(source, build_env=build_env)
        workload = default_workload(cost, levels, input_len, output_len)
        projection, cost = project_source(source, chip=chip, cards=cards, dtype=dtype, graph_mode=graph_mode,
                                          workload=workload, cost=cost)
    except NpuportError as exc:
        raise fail(first_line(exc), exit_code(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps(projection.as_json(), indent=1) + "\n")
        return
    console.print(text(projection, cost), markup=False, highlight=False)
