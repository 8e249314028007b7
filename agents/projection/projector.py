"""One call from a model source to its projection on a chip: the cost at full size, the chip's figures, the
calibrated efficiency, the cards (as asked, or the fewest that hold the model), the dtype (as asked, or the
chip's serving dtype). Used by ``npuport project``, the report's section and serve.sh's sizing."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents.projection.config_cost import config_cost
from agents.projection.cost import ModelCost
from agents.projection.engine import Efficiency
from agents.projection.hardware import WEIGHT_BYTES, chip_hardware
from agents.projection.model_source import ModelSource, from_state, model_cost
from agents.projection.project import Deployment, Projection, Workload, cards_for, project
from agents.projection.published import calibrated
from knowledge.errors import GoalError, NpuportError, first_line
from sandbox.targets import DEFAULT_CHIP, get_chip

DEFAULT_CONCURRENCY = (1, 8, 32, 100)
DEFAULT_INPUT = 1024
DEFAULT_OUTPUT = 256


def default_workload(cost: ModelCost, concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY,
                     input_len: int | None = None, output_len: int | None = None) -> Workload:
    """The workload: the lengths asked, else 1024 in / 256 out within the model's own length; one image per
    request for a model with an encoder."""
    out = output_len or DEFAULT_OUTPUT
    inp = input_len or DEFAULT_INPUT
    images = 1 if cost.encoder is not None else 0
    if cost.max_len and input_len is None:
        image_tokens = images * (cost.encoder.output_tokens if cost.encoder else 0)
        inp = max(16, min(inp, cost.max_len - out - image_tokens))
    return Workload(concurrency=list(concurrency), input_len=inp, output_len=out, images=images)


def project_source(source: ModelSource, *, chip: str | None = None, cards: int | None = None,
                   dtype: str | None = None, graph_mode: bool = True, workload: Workload | None = None,
                   build_env: bool = True, efficiency: Efficiency | None = None,
                   cost: ModelCost | None = None) -> tuple[Projection, ModelCost]:
    chip_key = chip or source.chip or DEFAULT_CHIP
    hw = chip_hardware(chip_key)
    record = get_chip(chip_key)
    serve_dtype = dtype or (record.serve_dtype if record else "bfloat16")
    if serve_dtype not in WEIGHT_BYTES:
        raise GoalError(f"--dtype {serve_dtype}: one of {', '.join(WEIGHT_BYTES)}", value=serve_dtype,
                        choices=list(WEIGHT_BYTES))
    hw.peak(serve_dtype)  # a dtype the chip has no published peak for is refused here, with the ones it has
    cost = cost or model_cost(source, build_env=build_env)
    if not cost.kinds:
        raise GoalError(f"nothing to project for {source.name}: {cost.source}")
    eff = efficiency or calibrated()
    wl = workload or default_workload(cost)
    dep = Deployment(cards=1, dtype=serve_dtype, graph_mode=graph_mode)
    image_tokens = wl.images * (cost.encoder.output_tokens if cost.encoder else 0)
    n = cards or cards_for(cost, hw, eff, dep, wl.input_len + wl.output_len + image_tokens)
    projection = project(cost, hw, eff, dep.model_copy(update={"cards": n}), wl, source.host)
    if cards is None:
        projection.notes.insert(0, f"{n} card(s): the fewest (a power of two within a {hw.cards_per_node}-card node) "
                                   "whose memory holds the weights, the runtime and a request")
    projection.notes += source.notes
    return projection, cost


def report_projection(state: Mapping[str, Any], model_dir: Path | None = None, implementation: str | None = None,
                      meta: bool = True) -> dict[str, Any] | None:
    """report.json's ``projection``: the projection of the port's model on its chip (the JSON schema of
    ``npuport project --json``, the markdown section and the cost), or why there is none. ``meta``: build the
    full-size model on the meta device in the port's environment (a validated port); otherwise config
    arithmetic alone (a port that failed may not build)."""
    source = from_state(state, model_dir, implementation)
    if source is None:
        return None
    try:
        cost = None if meta else config_cost(source.config, "the port did not validate: its code is not built")
        projection, cost = project_source(source, build_env=False, cost=cost)
    except NpuportError as exc:
        return {"error": first_line(exc)}
    except Exception as exc:  # the report is written whatever the projection does; the section says why
        return {"error": f"the projection failed: {type(exc).__name__}: {first_line(exc)}"}
    from agents.projection.render import markdown

    return {**projection.as_json(), "input_len": projection.input_len, "output_len": projection.output_len,
            "images": projection.images, "model_source": cost.source, "efficiency": projection.efficiency,
            "notes": projection.notes, "cost": cost.model_dump(), "markdown": markdown(projection, cost)}
