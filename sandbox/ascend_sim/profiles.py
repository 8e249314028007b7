"""Chip profiles for the emulated Ascend target.

Values are public product facts in our own words (approximate where marked); they drive what the
emulator reports (device name, memory) and which dtypes it accepts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChipProfile:
    key: str
    device_name: str  # what torch.npu.get_device_name() returns on such a host
    product: str
    soc_version: str
    memory_gib: int  # device memory per visible device
    bf16: bool  # False: no bfloat16 kernels (aclnn dtype allow-lists omit DT_BFLOAT16)
    ai_cores: int  # cube cores (approximate; informational)
    fp16_tflops: float  # peak dense fp16 (approximate; informational, never used for timings)
    graph_modes: tuple[str, ...]
    notes: str


PROFILES: dict[str, ChipProfile] = {
    "910b": ChipProfile(
        key="910b",
        device_name="Ascend910B3",
        product="Atlas A2 training/inference series (Atlas 800T/800I A2)",
        soc_version="Ascend910B3",
        memory_gib=64,
        bf16=True,
        ai_cores=20,
        fp16_tflops=313.0,
        graph_modes=("aclgraph", "torchair"),
        notes="aclnn kernels for most aten ops; HCCS 8-card ring.",
    ),
    "a3": ChipProfile(
        key="a3",
        device_name="Ascend910_9392",
        product="Atlas A3 training/inference series (Atlas 800T/800I A3, super-pod)",
        soc_version="Ascend910_9392",
        memory_gib=64,
        bf16=True,
        ai_cores=24,
        fp16_tflops=376.0,
        graph_modes=("aclgraph", "torchair"),
        notes="Two dies per package, each seen as one device; same op library as A2.",
    ),
    "310p": ChipProfile(
        key="310p",
        device_name="Ascend310P3",
        product="Atlas 300I Pro / 300I Duo inference cards",
        soc_version="Ascend310P3",
        memory_gib=24,
        bf16=False,
        ai_cores=8,
        fp16_tflops=140.0,
        graph_modes=("torchair",),
        notes="No bfloat16: run models in float16. Many fused ops (npu_fusion_attention, MoE) are A2/A3 only.",
    ),
}


def get_profile(chip: str) -> ChipProfile:
    key = chip.lower().replace("atlas-", "").replace("ascend", "").strip()
    aliases = {"910b": "910b", "a2": "910b", "910b3": "910b", "a3": "a3", "310p": "310p", "310p3": "310p"}
    if key not in aliases:
        raise ValueError(f"unknown Ascend chip {chip!r}; known: {sorted(PROFILES)}")
    return PROFILES[aliases[key]]
