"""The published serving figures (agents/data/published_serving.yaml) as typed records, each projected the way
``npuport project`` projects a model (config arithmetic on the figure's model config, the chip's public
figures), and the engine efficiency calibrated on them (``calibrated``; ``exclude`` leaves figures out, which
is how bench/projection.py checks each figure with a fit that never saw it)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from agents.projection.config_cost import config_cost
from agents.projection.cost import ModelCost
from agents.projection.engine import Efficiency, fit
from agents.projection.hardware import chip_hardware
from agents.projection.project import KV_BYTES, Deployment, HostCosts, Workload, memory_of, project

DATA = Path(__file__).resolve().parents[1] / "data" / "published_serving.yaml"
METRICS = ("output_tok_s", "tpot_ms", "ttft_ms")


class Figure(BaseModel):
    id: str
    source: str
    model: str
    chip: str
    cards: int
    replicas: int = 1
    dtype: str = "bfloat16"
    expert_dtype: str | None = None
    graph_mode: bool = True
    concurrency: int
    input_len: int
    output_len: int
    images: int = 0
    metric: str
    published: float
    derived: str = ""

    def deployment(self) -> Deployment:
        return Deployment(cards=self.cards, replicas=self.replicas, dtype=self.dtype, expert_dtype=self.expert_dtype,
                          graph_mode=self.graph_mode)

    def workload(self) -> Workload:
        return Workload(concurrency=[self.concurrency], input_len=self.input_len, output_len=self.output_len,
                        images=self.images)


class MemoryFigure(BaseModel):
    id: str
    source: str
    model: str
    chip: str
    cards: int
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.9
    weights_gb_per_card: float
    """As vLLM logs it (GiB)."""
    kv_cache_tokens: int


class Published(BaseModel):
    sources: dict[str, dict[str, str]]
    models: dict[str, dict[str, Any]]
    figures: list[Figure]
    memory: list[MemoryFigure] = Field(default_factory=list)


@functools.cache
def load_published(path: Path = DATA) -> Published:
    return Published.model_validate(yaml.safe_load(path.read_text()))


@functools.cache
def model_cost(name: str, path: Path = DATA) -> ModelCost:
    entry = load_published(path).models[name]
    return config_cost(entry["config"], f"the published figure's model, config from {entry.get('config_source')}")


def projected(fig: Figure, eff: Efficiency, path: Path = DATA) -> float:
    """The figure's metric as npuport projects it under ``eff``."""
    p = project(model_cost(fig.model, path), chip_hardware(fig.chip), eff, fig.deployment(), fig.workload(),
                HostCosts())
    row = p.rows[0]
    return {"output_tok_s": row.output_tok_s, "tpot_ms": row.tpot_ms, "ttft_ms": row.ttft_ms}[fig.metric]


def reserve_gib(figures: list[MemoryFigure], path: Path = DATA) -> float | None:
    """The runtime's memory beside weights and KV cache, from published memory figures: what is left of the
    usable memory once the published weights and the published KV cache (tokens x bytes per token) are out."""
    found = []
    for m in figures:
        cost = model_cost(m.model, path)
        hw = chip_hardware(m.chip)
        dep = Deployment(cards=m.cards, dtype=m.dtype, gpu_memory_utilization=m.gpu_memory_utilization)
        kv_token = memory_of(cost, hw, Efficiency(), dep, Workload()).kv_bytes_per_token_per_card
        usable = m.gpu_memory_utilization * hw.hbm_gib
        found.append(usable - m.weights_gb_per_card - m.kv_cache_tokens * kv_token / 2**30)
    return sum(found) / len(found) if found else None


def calibrated(exclude: frozenset[str] = frozenset(), path: Path = DATA) -> Efficiency:
    """The efficiency fitted on every published figure but ``exclude``. The fit over all of them (what every
    projection uses) is remembered under the npuport home, keyed by the figures and the code that fits them."""
    if exclude:
        return _calibrated(exclude, path)
    memo = _fit_memo(path)
    try:
        return Efficiency.model_validate_json(memo.read_text())
    except (OSError, ValueError):
        pass
    eff = _calibrated(exclude, path)
    with contextlib.suppress(OSError):  # a read-only home: the fit is made again next time
        memo.write_text(eff.model_dump_json())
    return eff


def _fit_memo(path: Path) -> Path:
    """Where the fit over every figure is remembered: its key is the figures' file, the chip records and the
    projection's own code (any change to them fits again)."""
    from knowledge.home import cache_dir
    from sandbox.targets import chips

    h = hashlib.sha256(path.read_bytes())
    for source in sorted(Path(__file__).parent.glob("*.py")) + [Path(chips.__file__)]:
        h.update(source.read_bytes())
    return cache_dir("projection") / f"efficiency-{h.hexdigest()[:24]}.json"


@functools.cache
def _calibrated(exclude: frozenset[str], path: Path) -> Efficiency:
    pub = load_published(path)
    residuals = []
    for fig in pub.figures:
        if fig.id in exclude:
            continue
        residuals.append((fig.id, fig.source, _residual(fig, path)))
    reserve = reserve_gib([m for m in pub.memory if m.id not in exclude], path)
    base = Efficiency(reserve_gib=reserve) if reserve is not None else Efficiency()
    eff = fit(residuals, base)
    return eff.model_copy(update={"note": f"{eff.note} (agents/data/published_serving.yaml)"
                                          + (f"; runtime reserve {reserve:.1f} GiB from {len(pub.memory)} published "
                                             "memory figure(s)" if reserve is not None else "")})


def _residual(fig: Figure, path: Path) -> Any:
    def residual(eff: Efficiency) -> float:
        return math.log(max(projected(fig, eff, path), 1e-9) / fig.published)
    return residual


def kv_bytes_note() -> str:
    return f"KV cache in a {KV_BYTES:g}-byte dtype"
