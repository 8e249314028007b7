"""The target and chip registry: every reader (CLI, API, planner, environment, harness, tuner, deploy,
report) asks here, and unknown names are refused with the list of known ones."""

from __future__ import annotations

from knowledge.errors import TargetError
from sandbox.targets import ascend_sim, auto, cpu, npu
from sandbox.targets.base import Chip, Target, TargetSpec
from sandbox.targets.chips import CHIPS as _CHIPS

# Add a target: one module in this package with a SPEC, listed here (the order is --help's order).
TARGETS: dict[str, TargetSpec] = {m.SPEC.name: m.SPEC for m in (cpu, ascend_sim, npu, auto)}
CHIPS: dict[str, Chip] = {c.key: c for c in _CHIPS}


def target_names() -> tuple[str, ...]:
    return tuple(TARGETS)


def chip_names() -> tuple[str, ...]:
    return tuple(CHIPS)


def get_target_spec(name: str) -> TargetSpec:
    if name not in TARGETS:
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]


def canonical_chip(name: str) -> str | None:
    """The chip key for a name or alias ("Ascend 910B3", "A2", "310P"), or None."""
    key = name.lower().replace("atlas-", "").replace("ascend", "").replace(" ", "").strip()
    for chip in CHIPS.values():
        if key == chip.key or key in chip.aliases:
            return chip.key
    return None


def get_chip(name: str) -> Chip:
    key = canonical_chip(name) if name not in CHIPS else name
    if key is None:
        raise TargetError(f"unknown chip {name!r}; choose one of {', '.join(CHIPS)}")
    return CHIPS[key]


def resolve_target(
    name: str,
    *,
    chip: str = "910b",
    torch_npu: str = "2.13.0",
    strict: bool = False,
    matrix_path: str | None = None,
) -> Target:
    spec = get_target_spec(name)
    if chip not in CHIPS:
        raise TargetError(f"unknown chip {chip!r}; choose one of {', '.join(CHIPS)}")
    return spec.resolve(chip=chip, torch_npu=torch_npu, strict=strict, matrix_path=matrix_path)
