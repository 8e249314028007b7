"""The CUDA-only libraries the agents know (import codemod, debugger signatures): one list, no imports."""

from __future__ import annotations

CUDA_ONLY = frozenset(
    {
        "flash_attn", "flash_attn_2_cuda", "flash_attn_interface", "xformers", "apex", "bitsandbytes",
        "triton", "mamba_ssm", "causal_conv1d", "fused_dense_lib", "rotary_emb", "dropout_layer_norm",
        "flashinfer", "liger_kernel", "transformer_engine",
    }
)
