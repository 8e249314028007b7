"""What a target and a chip are, and the registry that lists them.

A target (cpu, ascend-sim, npu, auto) is one module in this package holding a ``TargetSpec``: its
name, what it is, whether the port sees an Ascend device, and how to resolve it into a ``Target``
the sandbox runs. A chip is a ``Chip`` record in chips.py. ``registry.py`` lists both; the CLI, the
API, the planner, the harness, the tuner, the deploy bundle and the report read them from there, so
adding a target or a chip is one module or one record (docs/architecture.md says how).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Target:
    """A resolved target: what the harness needs to run the model there."""

    name: str
    device: str  # device string the port runs on
    bootstrap: str | None = None  # "module:function" the harness calls before importing the model
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    reason: str = ""  # why this target (for auto)

    def harness_target(self) -> dict[str, Any]:
        return {"name": self.name, "bootstrap": self.bootstrap, "options": dict(self.options)}


Resolve = Callable[..., Target]
"""resolve(*, chip, torch_npu, strict, matrix_path) -> Target; raises TargetError when unusable."""


@dataclass(frozen=True)
class ScriptSetup:
    """How a standalone script (the bundle's run.py) reaches a target without npuport's sandbox: the
    modules it imports first, an optional bootstrap ``module:function`` called with the target's
    options, and the device string it then runs on."""

    device: str
    imports: tuple[str, ...] = ()
    bootstrap: str | None = None
    options: tuple[str, ...] = ()
    """The request fields the bootstrap takes as options (e.g. "chip", "torch_npu")."""
    needs_npuport: bool = False
    """The bootstrap is npuport's own (run.py then needs npuport importable)."""


@dataclass(frozen=True)
class TargetSpec:
    """A target's name and capabilities: the rest of npuport asks these questions, never the name."""

    name: str
    summary: str
    """One line for --help and the docs."""
    npu_like: bool
    """The port sees an Ascend device (torch.npu): chip, op-support matrix and dtype rules apply."""
    resolve: Resolve
    uses_matrix: bool = False
    """Needs the op-support matrix of the chosen torch_npu build (the environment node fetches it)."""
    emulated: bool = False
    """An emulation on the host CPU: no CANN needed, numerics are the host torch's."""
    needs_device: bool = False
    """Needs real hardware (and its toolkit, CANN): probed before use (auto, verify)."""
    compile_backend: str | None = None
    """torch.compile's backend here ("inductor", "torchair"); None: the target provides none."""
    graph_capture: bool = False
    """compile mode reduce-overhead captures device graphs here; without, it only adds overhead."""
    probe: Callable[[], tuple[bool, str]] | None = None
    """Is the hardware here? (ok, why); None: always usable. Asked before a run that needs it."""
    chooser: bool = False
    """Resolves to another target (auto), so no port ever runs "on" it."""
    script: ScriptSetup | None = None
    """How the bundle's run.py reaches it; None: run.py does not offer it."""


@dataclass(frozen=True)
class ChipPerf:
    """The public figures a projection of serving on a chip needs, per device as vLLM counts devices (a
    die of an A3 package is one device). Each figure names where it is published (``sources``); where
    public figures disagree the note says so. None of these is measured by npuport."""

    peak_tflops: dict[str, float]
    """Dense cube-unit peak per dtype ("bfloat16", "float16", "int8"); a dtype absent has no published peak."""
    hbm_gib: float
    hbm_gbps: float
    """Device memory bandwidth, GB/s."""
    cards_per_node: int
    """Devices one server holds (what --tensor-parallel-size can span without a second node)."""
    interconnect: str
    interconnect_gbps: float
    """Device-to-device bandwidth within a node, GB/s per device."""
    sources: dict[str, str] = field(default_factory=dict)
    """figure name -> where it is published (URL) and, where sources disagree, the spread."""


@dataclass(frozen=True)
class Chip:
    """An Ascend chip: the facts the planner, tuner, deploy bundle and report read. The emulator's own
    details (device name, SoC version, cores) are in sandbox/ascend_sim/profiles.py; a test keeps the
    two in agreement."""

    key: str
    """The name users give (--chip)."""
    product: str
    memory_gib: float
    """HBM per device, as published for the product line (approximate; not measured here)."""
    dtypes: tuple[str, ...]
    """Floating dtypes with kernels on this chip."""
    op_support: str
    """Where op support comes from: the op-plugin matrix of the chosen torch_npu build, plus chip limits."""
    serve_dtype: str
    """The dtype vLLM-Ascend serves in by default on this chip."""
    aliases: tuple[str, ...] = ()
    """Other spellings accepted in goal text and --chip (lower case, no spaces)."""
    serve_note: str = ""
    """Why the serve default is what it is, when it is not the usual one."""
    doc_words: tuple[str, ...] = ()
    """Words (lower case) marking a vLLM-Ascend doc written for this chip alone (its serving settings
    differ); empty for chips the docs' general settings are written for."""
    perf: ChipPerf | None = None
    """Public peak compute, memory and interconnect figures (agents/projection reads them); None: unknown,
    and a projection on this chip says so."""

    @property
    def bf16(self) -> bool:
        return "bfloat16" in self.dtypes
