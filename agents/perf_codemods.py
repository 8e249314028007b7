"""Performance codemods (hazards H4, H6): rewrites whose result the validator can prove harmless. They
live with their rules (agents/rules/h4_fused*.py, agents/rules/h6_codemods.py, h6_moe.py); this module re-exports
them under their old names."""

from __future__ import annotations

from agents.rules.h4_fused import (
    ATTENTION_HELPER,
    ATTENTION_MARKER,
    NPU_MARKER,
    NPU_PRELUDE,
    RMS_HELPER,
    RMS_MARKER,
    ROTARY_HELPER,
    ROTARY_MARKER,
    fused_rms_norm,
    fused_rotary_mul,
)
from agents.rules.h4_fused_attention import fused_attention
from agents.rules.h6_codemods import (
    FILL_HELPERS,
    FILL_MARKER,
    vectorise_mask_loops,
)
from agents.rules.h6_moe import MOE_HELPER, MOE_MARKER, moe_dense_dispatch

__all__ = [
    "ATTENTION_HELPER", "ATTENTION_MARKER", "FILL_HELPERS", "FILL_MARKER", "MOE_HELPER", "MOE_MARKER", "NPU_MARKER",
    "NPU_PRELUDE", "RMS_HELPER", "RMS_MARKER", "ROTARY_HELPER", "ROTARY_MARKER", "fused_attention", "fused_rms_norm",
    "fused_rotary_mul", "moe_dense_dispatch", "vectorise_mask_loops",
]
