"""The target and chip registry: every reader (CLI, API, planner, environment, harness, tuner, deploy,
report) asks here, and unknown names are refused with the list of known ones."""

from __future__ import annotations

from knowledge.errors import TargetError
from knowledge.settings import DEFAULT_TORCH_NPU
from sandbox.targets import ascend_sim, auto, cpu, npu
from sandbox.targets.base import Chip, Target, TargetSpec
from sandbox.targets.chips import CHIPS as _CHIPS

# Add a target: one module in this package with a SPEC, listed here (the order is --help's order).
TARGETS: dict[str, TargetSpec] = {m.SPEC.name: m.SPEC for m in (cpu, ascend_sim, npu, auto)}
CHIPS: dict[str, Chip] = {c.key: c for c in _CHIPS}

# The defaults every reader uses (CLI flags, PortRequest, the batch manifest, the tuner, the bundle).
DEFAULT_TARGET = auto.SPEC.name
"""What a port runs on unless told: the real device when there is one, else the emulator."""
DEFAULT_CHIP = _CHIPS[0].key
"""The first chip record (chips.py): the chip a port targets unless told."""
EMULATED_TARGET = ascend_sim.SPEC.name
"""The target that emulates an Ascend host on any CPU (the demo's, `npuport ops`')."""
REFERENCE_TARGET = cpu.SPEC.name
"""Where the original model runs as the reference (float32 on the host CPU)."""


def target_names() -> tuple[str, ...]:
    return tuple(TARGETS)


def chip_names() -> tuple[str, ...]:
    return tuple(CHIPS)


def get_target_spec(name: str) -> TargetSpec:
    if name not in TARGETS:
        raise TargetError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}", value=name,
                          choices=list(TARGETS))
    return TARGETS[name]


def canonical_chip(name: str) -> str | None:
    """The chip key for a name or alias ("Ascend 910B3", "A2", "310P"), or None."""
    key = name.lower().replace("atlas-", "").replace("ascend", "").replace(" ", "").strip()
    for chip in CHIPS.values():
        if key == chip.key or key in chip.aliases:
            return chip.key
    return None


def get_chip(name: str | None = None) -> Chip:
    """The one chip resolver: a key, an alias or a product spelling ("910B3", "Atlas A2"); None: the default."""
    name = DEFAULT_CHIP if name is None else str(name)
    key = canonical_chip(name) if name not in CHIPS else name
    if key is None:
        raise TargetError(f"unknown chip {name!r}; choose one of {', '.join(CHIPS)}", value=name,
                          choices=list(CHIPS))
    return CHIPS[key]


def doc_chip(text: str) -> str | None:
    """The chip a document was written for alone (its ``doc_words`` appear in ``text``), else None."""
    low = text.lower()
    return next((c.key for c in CHIPS.values() if any(w in low for w in c.doc_words)), None)


def serving_chip(chip: str | None) -> str | None:
    """What ``doc_chip`` reads for docs that suit ``chip``: its key when docs are written for it alone."""
    c = get_chip(chip)
    return c.key if c.doc_words else None


def target_spec_of(target: Target | str | None) -> TargetSpec:
    """The spec of a resolved target (or a target's name); an unknown or missing name reads as the reference
    target's. The graph state's target is read with agents/state.py ``capabilities_of``."""
    name = target.name if isinstance(target, Target) else target
    return TARGETS.get(str(name), TARGETS[REFERENCE_TARGET])


def reference_target() -> Target:
    """The target the original model runs on as the reference."""
    return TARGETS[REFERENCE_TARGET].resolve()


def script_targets() -> dict[str, TargetSpec]:
    """The targets the bundle's run.py offers (each one's ScriptSetup says how it reaches it)."""
    return {n: s for n, s in TARGETS.items() if s.script is not None}


def resolve_target(
    name: str,
    *,
    chip: str | None = None,
    torch_npu: str = DEFAULT_TORCH_NPU,
    strict: bool = False,
    matrix_path: str | None = None,
) -> Target:
    spec = get_target_spec(name)
    return spec.resolve(chip=get_chip(chip).key, torch_npu=torch_npu, strict=strict, matrix_path=matrix_path)
