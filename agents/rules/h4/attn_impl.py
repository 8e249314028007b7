"""H4: which attention implementation replaces a FlashAttention one, and the same switch in config.json.

A model selects ``flash_attention_2`` in its code (a keyword, a parameter default, an assignment) or in
config.json (``"_attn_implementation": "flash_attention_2"``, often in a sub-config such as a vision
tower's). Either way transformers refuses to build the model on a host without flash_attn ("FlashAttention2
has been toggled on, but it cannot be used"), and the value set in config.json overrides the code's default.

What replaces it is chosen once for the whole model, because the selection flows across files (a
config class's default, config.json, a lookup in a table of attention functions in the modeling file):
"sdpa" (torch's SDPA runs on Ascend and the CPU), unless some table in the model's code that maps a
FlashAttention name to a function has no "sdpa" entry; then "eager", which such tables have (the lookup
would fail with a KeyError on "sdpa"). Both compute the same attention as FlashAttention."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agents.models import Finding
from agents.rules.base import BLOCKS, HIGH
from agents.rules.config_json import rewrite_values, value_findings
from agents.rules.context import TextFile
from agents.rules.kit import CodemodResult

FLASH_IMPLS = ("flash_attention_2", "flash_attention_3")
IMPL_KEYS = ("attn_implementation", "_attn_implementation")
CONFIG_RULE = "flash-attention-config"
TABLE_WITHOUT_SDPA = "flash-attention-table-no-sdpa"


def impl_for(findings: list[Finding]) -> str:
    """The implementation every FlashAttention selection of this model becomes (see the module doc)."""
    return "eager" if any(f.rule == TABLE_WITHOUT_SDPA for f in findings) else "sdpa"


def plan_params(findings: list[Finding]) -> dict[str, Any]:
    return {"impl": impl_for(findings)}


def flash_values(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every attention-implementation key that names FlashAttention, at any level."""
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from flash_values(value, f"{prefix}{key}.")
        elif key in IMPL_KEYS and value in FLASH_IMPLS:
            yield f"{prefix}{key}", value


def detect_config(tf: TextFile) -> list[Finding]:
    return value_findings(tf, flash_values, "H4", CONFIG_RULE, lambda key, value: (
        f"config.json selects attention `{key}`: \"{value}\"; transformers refuses to build the model without "
        "flash_attn (CUDA only), and this value overrides the code's default; the port's implementation goes in "
        "its place"), BLOCKS, HIGH)


def config_attn_impl(source: str, *, impl: str = "sdpa", **_: Any) -> CodemodResult:
    """Each FlashAttention value of an attention-implementation key in a config.json -> ``impl``, in place
    (the rest of the text as written)."""
    return rewrite_values(source, flash_values, impl,
                          f"flash-attn needs CUDA; {impl} computes the same attention on Ascend and the CPU")
