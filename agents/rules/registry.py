"""The ONE list of hazard rules (agents/rules/h*.py). The scanner, the rule policy, the debugger and the
report read the rules through ``active()``; a test swaps in its own registry with ``use_registry``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agents.rules import (
    h1_cuda_device,
    h2_autocast,
    h3_cuda_libraries,
    h5_dtypes,
    h7_fallback_ops,
    h8_framework,
    h9_distributed,
    h10_serving,
    h11_latent,
    h12_half_precision,
    h13_kernel_flags,
    h14_host_memory,
    h15_graph_compile,
    h16_attention_calls,
    h17_fixed_sizes,
    h18_version_couplings,
    h20_tuple_kv_cache,
    h21_kv_cat_growth,
    h22_int64_routing,
    h23_checkpoint_config,
    h24_missing_names,
    h25_changed_api,
    h26_generate_inputs,
    h27_complex,
)
from agents.rules.base import HazardRule, Registry
from agents.rules.h4 import attention as h4_attention
from agents.rules.h6 import host_sync as h6_host_sync

RULES: tuple[HazardRule, ...] = (
    h1_cuda_device.RULE,
    h2_autocast.RULE,
    h3_cuda_libraries.RULE,
    h4_attention.RULE,
    h5_dtypes.RULE,
    h6_host_sync.RULE,
    h7_fallback_ops.RULE,
    h8_framework.RULE,
    h9_distributed.RULE,
    h10_serving.RULE,
    h11_latent.RULE,
    h12_half_precision.RULE,
    h13_kernel_flags.RULE,
    h14_host_memory.RULE,
    h15_graph_compile.RULE,
    h16_attention_calls.RULE,
    h17_fixed_sizes.RULE,
    h18_version_couplings.RULE,
    h20_tuple_kv_cache.RULE,
    h21_kv_cat_growth.RULE,
    h22_int64_routing.RULE,
    h23_checkpoint_config.RULE,
    h24_missing_names.RULE,
    h25_changed_api.RULE,
    h26_generate_inputs.RULE,
    h27_complex.RULE,
)
DEFAULT = Registry(RULES)

# A stack, not a context variable: graph nodes may run on worker threads, and a test's registry must
# reach them (tests run one port at a time per process).
_stack: list[Registry] = []


def active() -> Registry:
    """The registry in force: the innermost ``use_registry``, else DEFAULT."""
    return _stack[-1] if _stack else DEFAULT


@contextmanager
def use_registry(registry: Registry) -> Iterator[Registry]:
    """Run with another registry (e.g. ``DEFAULT.with_rules(TOY_RULE)``) in force."""
    _stack.append(registry)
    try:
        yield registry
    finally:
        _stack.remove(registry)
