"""What a projection needs of the machine it projects on, as one record: a chip's public figures (the chip
registry, sandbox/targets/chips.py) or a profile of this host's CPU measured by bench/projection.py."""

from __future__ import annotations

from pydantic import BaseModel, Field

from knowledge.errors import GoalError
from sandbox.targets import DEFAULT_CHIP, chip_names, get_chip

WEIGHT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}
"""Bytes per weight of each serving dtype (int8: W8A8, int4: 4-bit weights with half-precision activations)."""
COMPUTE_DTYPE = {"int4": "bfloat16"}
"""The dtype the matrix units compute in when weights are stored narrower than activations."""


class Hardware(BaseModel):
    name: str
    """The chip's key, or "this host's CPU"."""
    product: str = ""
    peak_tflops: dict[str, float]
    hbm_gib: float
    hbm_gbps: float
    cards_per_node: int = 1
    interconnect: str = ""
    interconnect_gbps: float = 0.0
    sources: dict[str, str] = Field(default_factory=dict)
    measured: bool = False
    """Measured on this host (a CPU profile) rather than published."""

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s the matrix units reach for ``dtype`` (its compute dtype for narrow weights)."""
        compute = COMPUTE_DTYPE.get(dtype, dtype)
        half = {"float16": "bfloat16", "bfloat16": "float16"}  # the cube units run both half types at one rate
        tflops = self.peak_tflops.get(compute) or (self.peak_tflops.get(half[compute]) if compute in half else None)
        if not tflops:
            raise GoalError(f"{self.name} has no published {compute} peak (it has "
                            f"{', '.join(sorted(self.peak_tflops)) or 'none'}): pick --dtype among those",
                            value=dtype, choices=sorted(self.peak_tflops))
        return tflops * 1e12


def chip_hardware(chip: str | None = None) -> Hardware:
    """The chip's public figures; a chip without them is refused with the chips that have them."""
    record = get_chip(chip or DEFAULT_CHIP)
    if record is None:
        raise GoalError(f"unknown chip {chip!r}: known chips are {', '.join(chip_names())}", value=chip,
                        choices=list(chip_names()))
    perf = record.perf
    if perf is None:
        have = [c for c in chip_names() if (rec := get_chip(c)) is not None and rec.perf is not None]
        raise GoalError(f"the chip registry has no performance figures for {record.key} (sandbox/targets/chips.py "
                        f"ChipPerf); chips with them: {', '.join(have)}", value=record.key, choices=have)
    return Hardware(name=record.key, product=record.product, peak_tflops=dict(perf.peak_tflops), hbm_gib=perf.hbm_gib,
                    hbm_gbps=perf.hbm_gbps, cards_per_node=perf.cards_per_node, interconnect=perf.interconnect,
                    interconnect_gbps=perf.interconnect_gbps, sources=dict(perf.sources))
