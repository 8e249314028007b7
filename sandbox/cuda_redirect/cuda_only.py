"""The CUDA-only libraries npuport knows: ONE table, read by the scanner (H3), the import-guard codemod,
the debugger's signatures and the reference run's import stubs.

It lives in sandbox/ because the sandbox harness needs it and must not import agents/; it imports nothing,
so the harness's isolated interpreter loads it cheaply. The agents import it from here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CudaOnlyLibrary:
    module: str  # import path; a dotted prefix ("deepspeed.ops" covers deepspeed.ops.*)
    what: str  # what it is, for messages
    instead: str  # what to use on Ascend
    dists: tuple[str, ...] = ()  # pip distribution names (normalised: lower case, "-")
    guarded: bool = False  # the whole package is CUDA-only: the import-guard codemod guards/removes its imports
    stubbed: bool = False  # reference runs stub an unguarded import of its top-level package


_SDPA = "use torch SDPA or npu_fusion_attention"
_QUANT = "load unquantised weights or Ascend quantisation"

LIBRARIES: tuple[CudaOnlyLibrary, ...] = (
    CudaOnlyLibrary("flash_attn", "FlashAttention CUDA kernels", "use torch SDPA or torch_npu.npu_fusion_attention",
                    ("flash-attn",), guarded=True, stubbed=True),
    CudaOnlyLibrary("flash_attn_2_cuda", "FlashAttention-2 CUDA extension", _SDPA, guarded=True, stubbed=True),
    CudaOnlyLibrary("flash_attn_interface", "FlashAttention-3 (Hopper) kernels", _SDPA, guarded=True, stubbed=True),
    CudaOnlyLibrary("flash_attn_cuda", "FlashAttention-1 CUDA extension", _SDPA),
    CudaOnlyLibrary("xformers", "xFormers CUDA kernels", _SDPA, ("xformers",), guarded=True, stubbed=True),
    CudaOnlyLibrary("apex", "NVIDIA Apex fused CUDA ops", "use the plain torch modules (torch.nn.LayerNorm, "
                    "torch.optim) or torch_npu fused ops", ("apex",), guarded=True, stubbed=True),
    CudaOnlyLibrary("bitsandbytes", "bitsandbytes CUDA quantisation kernels", "load unquantised weights or use "
                    "Ascend quantisation (msModelSlim / npu_quant_matmul)", ("bitsandbytes",), guarded=True,
                    stubbed=True),
    CudaOnlyLibrary("triton", "Triton GPU kernels", "rewrite with torch ops or torch_npu fused ops (triton-ascend "
                    "is a separate port)", ("triton",), guarded=True, stubbed=True),
    CudaOnlyLibrary("deepspeed.ops", "DeepSpeed CUDA ops", "use the torch implementation or DeepSpeed's NPU "
                    "accelerator", stubbed=True),
    CudaOnlyLibrary("vllm.model_executor.layers.fused_moe", "vLLM fused MoE CUDA/Triton kernels",
                    "use vllm-ascend's MoE or torch_npu npu_moe_* / npu_grouped_matmul", stubbed=True),
    CudaOnlyLibrary("vllm._custom_ops", "vLLM CUDA custom ops", "use vllm-ascend's ops", stubbed=True),
    CudaOnlyLibrary("vllm._C", "vLLM compiled CUDA ops", "use vllm-ascend's ops", stubbed=True),
    CudaOnlyLibrary("vllm.vllm_flash_attn", "vLLM's FlashAttention build", "use vllm-ascend's attention backend",
                    ("vllm-flash-attn",), stubbed=True),
    CudaOnlyLibrary("mamba_ssm", "Mamba selective-scan CUDA kernels", "use a torch reference scan", ("mamba-ssm",),
                    guarded=True, stubbed=True),
    CudaOnlyLibrary("causal_conv1d", "causal-conv1d CUDA kernel", "use torch.nn.functional.conv1d with left padding",
                    ("causal-conv1d",), guarded=True, stubbed=True),
    CudaOnlyLibrary("selective_scan_cuda", "selective-scan CUDA extension", "use a torch reference scan"),
    CudaOnlyLibrary("flash_rwkv", "RWKV linear-attention CUDA kernels", "use the model's torch recurrence",
                    ("flash-rwkv",), guarded=True, stubbed=True),
    CudaOnlyLibrary("fused_dense_lib", "FlashAttention fused dense CUDA extension", "use torch.nn.Linear",
                    guarded=True, stubbed=True),
    CudaOnlyLibrary("dropout_layer_norm", "FlashAttention fused LayerNorm CUDA extension", "use torch.nn.LayerNorm "
                    "or npu_rms_norm", guarded=True, stubbed=True),
    CudaOnlyLibrary("rotary_emb", "FlashAttention rotary CUDA extension", "use torch ops or npu_rotary_mul",
                    guarded=True, stubbed=True),
    CudaOnlyLibrary("flashinfer", "FlashInfer CUDA kernels", "use torch SDPA or npu_fused_infer_attention_score",
                    ("flashinfer", "flashinfer-python"), guarded=True, stubbed=True),
    CudaOnlyLibrary("transformer_engine", "NVIDIA Transformer Engine", "use plain torch modules",
                    ("transformer-engine",), guarded=True, stubbed=True),
    CudaOnlyLibrary("liger_kernel", "Liger Triton kernels", "use plain torch modules or torch_npu fused ops",
                    ("liger-kernel",), guarded=True, stubbed=True),
    CudaOnlyLibrary("cupy", "CuPy (CUDA arrays)", "use numpy or torch"),
    CudaOnlyLibrary("pycuda", "PyCUDA", "use torch / torch_npu APIs", ("pycuda",)),
    CudaOnlyLibrary("pynvml", "NVIDIA management library", "use torch.npu memory APIs or npu-smi", ("pynvml",)),
    CudaOnlyLibrary("numba.cuda", "Numba CUDA kernels", "rewrite with torch ops"),
    CudaOnlyLibrary("sageattention", "SageAttention CUDA kernels", _SDPA),
    CudaOnlyLibrary("grouped_gemm", "grouped GEMM CUDA kernels", "use torch_npu.npu_grouped_matmul", ("grouped-gemm",)),
    CudaOnlyLibrary("megablocks", "MegaBlocks MoE CUDA kernels", "use torch_npu npu_moe_* ops", ("megablocks",)),
    CudaOnlyLibrary("flash_mla", "FlashMLA CUDA kernels", "use torch_npu fused attention", ("flash-mla",)),
    CudaOnlyLibrary("deep_gemm", "DeepGEMM CUDA kernels", "use torch matmul or npu_grouped_matmul", ("deep-gemm",)),
    CudaOnlyLibrary("awq", "AutoAWQ CUDA kernels", _QUANT, ("autoawq",)),
    CudaOnlyLibrary("auto_gptq", "AutoGPTQ CUDA kernels", _QUANT, ("auto-gptq",)),
    CudaOnlyLibrary("exllamav2", "ExLlamaV2 CUDA kernels", _QUANT, ("exllamav2",)),
)

BY_MODULE: dict[str, CudaOnlyLibrary] = {lib.module: lib for lib in LIBRARIES}
# Top-level packages that are CUDA-only as a whole (import guard codemod, debugger's missing-cuda-module).
CUDA_ONLY_ROOTS: frozenset[str] = frozenset(lib.module for lib in LIBRARIES if lib.guarded)
# Top-level packages whose unguarded import the reference run stubs (adds deepspeed and vllm, whose
# CUDA-only parts are submodules: the stub stands in for the whole package when it is not installed).
STUB_ROOTS: frozenset[str] = frozenset(lib.module.split(".")[0] for lib in LIBRARIES if lib.stubbed)
# Requirement names that pull a CUDA-only package.
CUDA_ONLY_DISTS: frozenset[str] = frozenset(d for lib in LIBRARIES for d in lib.dists)


# ----------------------------------------------------------------------------------------------
# Kernel-path flags in config.json ("flash_attn": true, "use_flash_attention": true, "fused_bias_fc": true)
# ----------------------------------------------------------------------------------------------

CONFIG_KERNEL_FLAG = re.compile(
    r"^_?(use_|enable_)?(flash_?attn\w*|flash_attention\w*|triton\w*|xformers|apex\w*|fused_\w+|cuda_kernels?|"
    r"bnb\w*|liger\w*)$", re.I)


def kernel_flags_off(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Set config flags that select a CUDA-only kernel path to False, at every nesting level, in place;
    the changes ("key: True -> False (...)"). The kernel exists neither on the CPU the reference runs on
    nor on Ascend, and both runs take the model's own torch path, so they compute the same thing."""
    changes: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict):
            changes += kernel_flags_off(value, f"{prefix}{key}.")
        elif value is True and CONFIG_KERNEL_FLAG.match(key):
            config[key] = False
            changes.append(f"{prefix}{key}: True -> False (a CUDA-only kernel path: the model's torch path runs, "
                           "in the reference and the port alike)")
    return changes
