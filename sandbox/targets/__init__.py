"""Targets: where a port runs, one module each, and the chips they emulate or drive. Isolation
(sandbox/isolation/process.py) is chosen independently.

- ``cpu`` (cpu.py): plain PyTorch on the CPU.
- ``ascend-sim`` (ascend_sim.py): the emulated Ascend runtime (sandbox/ascend_sim) on the CPU, for a
  chosen torch_npu version and chip, with the op-support matrix of that build.
- ``npu`` (npu.py): a real Ascend NPU through torch_npu.
- ``auto`` (auto.py): ``npu`` when torch_npu imports and sees a device, else ``ascend-sim``; says why.

Chips are records in chips.py; registry.py lists targets and chips for every reader.
"""

from __future__ import annotations

from knowledge.errors import TargetError
from sandbox.targets.base import Chip, ScriptSetup, Target, TargetSpec
from sandbox.targets.npu import probe_npu
from sandbox.targets.registry import (
    CHIPS as CHIP_REGISTRY,
)
from sandbox.targets.registry import (
    DEFAULT_CHIP,
    DEFAULT_TARGET,
    DEFAULT_TORCH_NPU,
    EMULATED_TARGET,
    REFERENCE_TARGET,
    TARGETS,
    canonical_chip,
    chip_names,
    doc_chip,
    get_chip,
    get_target_spec,
    reference_target,
    resolve_target,
    script_targets,
    serving_chip,
    target_names,
    target_spec_of,
)

TARGET_NAMES = target_names()
CHIPS = chip_names()

__all__ = [
    "CHIPS", "CHIP_REGISTRY", "DEFAULT_CHIP", "DEFAULT_TARGET", "DEFAULT_TORCH_NPU", "EMULATED_TARGET",
    "REFERENCE_TARGET", "TARGETS", "TARGET_NAMES", "Chip", "ScriptSetup", "Target", "TargetError", "TargetSpec",
    "canonical_chip", "chip_names", "doc_chip", "get_chip", "get_target_spec", "probe_npu", "reference_target",
    "resolve_target", "script_targets", "serving_chip", "target_names", "target_spec_of",
]
