"""What the emulator adds to each chip of the registry (sandbox/targets/chips.py): what a real host
reports (device name, SoC version, cube cores), its graph modes, and the two facts the emulator acts on
(memory per device, bfloat16 kernels).

One record and one alias table per chip: a chip is a ``Chip`` record in the registry, which alone resolves
names and aliases ("A2", "910B1", "Ascend 910B3") to a key (``sandbox.targets.get_chip``). Every way into
the emulator passes that key: the target's ``resolve`` (sandbox/targets/ascend_sim.py), the request
(``PortRequest.chip``) whose chip the bundle's run.py passes on. The emulator runs a floor below the
registry, inside the sandboxed process, so it keeps its own copy of the memory and the dtype; a test
holds them equal to the chip record's, and holds one profile per chip key (tests/test_target_registry.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChipProfile:
    key: str  # the registry's chip key
    device_name: str  # what torch.npu.get_device_name() returns on such a host
    soc_version: str
    ai_cores: int  # cube cores, as get_device_properties() reports them (approximate)
    memory_gib: int  # device memory per visible device (the chip record's memory_gib)
    bf16: bool  # False: no bfloat16 kernels (aclnn dtype allow-lists omit DT_BFLOAT16); the chip record's dtypes
    graph_modes: tuple[str, ...]
    notes: str


PROFILES: dict[str, ChipProfile] = {
    "910b": ChipProfile(
        key="910b",
        device_name="Ascend910B3",
        soc_version="Ascend910B3",
        ai_cores=20,
        memory_gib=64,
        bf16=True,
        graph_modes=("aclgraph", "torchair"),
        notes="aclnn kernels for most aten ops; HCCS 8-card ring.",
    ),
    "a3": ChipProfile(
        key="a3",
        device_name="Ascend910_9392",
        soc_version="Ascend910_9392",
        ai_cores=24,
        memory_gib=64,
        bf16=True,
        graph_modes=("aclgraph", "torchair"),
        notes="Two dies per package, each seen as one device; same op library as A2.",
    ),
    "310p": ChipProfile(
        key="310p",
        device_name="Ascend310P3",
        soc_version="Ascend310P3",
        ai_cores=8,
        memory_gib=24,
        bf16=False,
        graph_modes=("torchair",),
        notes="No bfloat16: run models in float16. Many fused ops (npu_fusion_attention, MoE) are A2/A3 only.",
    ),
}


def get_profile(chip: str) -> ChipProfile:
    """The profile of a chip key of the registry (an alias is the registry's to resolve, before this)."""
    if chip not in PROFILES:
        raise ValueError(f"unknown Ascend chip key {chip!r}; known: {sorted(PROFILES)} (sandbox.targets.get_chip "
                         "resolves an alias or a product spelling to its key)")
    return PROFILES[chip]
