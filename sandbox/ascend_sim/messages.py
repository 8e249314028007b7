"""Exact message formats of a real torch_npu host (see ../shared/data/npu_runtime_facts.md).

Only formats live here; the emulator decides when to emit them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import torch

# Error-code modules and codes of the torch_npu "ERR<MM><CCC>" suffix.
MODULES = {0: "PTA", 1: "OPS", 2: "DIST", 3: "GRAPH", 4: "PROF"}
CODES = {
    1: "invalid parameter",
    2: "invalid type",
    3: "invalid value",
    7: "feature not supported",
    100: "call acl api failed",
}

DOUBLE_WARNING = "Device do not support double dtype now, dtype cast replace with float."
ACLNN_PARAM_INVALID = 161002

_DT_NAMES = {
    torch.float32: "DT_FLOAT",
    torch.float16: "DT_FLOAT16",
    torch.bfloat16: "DT_BFLOAT16",
    torch.float64: "DT_DOUBLE",
    torch.int8: "DT_INT8",
    torch.uint8: "DT_UINT8",
    torch.int16: "DT_INT16",
    torch.int32: "DT_INT32",
    torch.int64: "DT_INT64",
    torch.bool: "DT_BOOL",
    torch.complex32: "DT_COMPLEX32",
    torch.complex64: "DT_COMPLEX64",
    torch.complex128: "DT_COMPLEX128",
}
_DT_BY_NAME = {v: k for k, v in _DT_NAMES.items()}


def dt_name(dtype: torch.dtype) -> str:
    return _DT_NAMES.get(dtype, "DT_UNDEFINED")


def parse_dtype(name: str) -> torch.dtype | None:
    """Accept 'DT_FLOAT', 'float32', 'torch.float32' (matrix files may use any)."""
    s = name.strip()
    if s.upper() in _DT_BY_NAME:
        return _DT_BY_NAME[s.upper()]
    s = s.removeprefix("torch.")
    dt = getattr(torch, s, None)
    return dt if isinstance(dt, torch.dtype) else None


def _now() -> str:
    return time.strftime("%Y-%m-%d-%H:%M:%S")


def error_suffix(module: int, code: int, device: int = 0) -> str:
    return (
        f"\n[ERROR] {_now()} (PID:{os.getpid()}, Device:{device}, RankID:-1) "
        f"ERR{module:02d}{code:03d} {MODULES[module]} {CODES[code]}"
    )


def fallback_warning(op: str) -> str:
    return (
        f"CAUTION: The operator '{op}' is not currently supported on the NPU backend and will fall back "
        "to run on the CPU. This may have performance implications."
    )


def fallback_disabled(op: str) -> str:
    # The module/code of this suffix is our reading (PTA, feature not supported); see docs/ascend-sim.md.
    return (
        f"The operator '{op}' would execute its main computation on CPU through dispatcher backend fallback "
        "because no kernel is registered for the NPU PrivateUse1 backend, but CPU fallback is disabled by "
        "TORCH_NPU_FALLBACK_CPU_DISABLE=1." + error_suffix(0, 7)
    )


def dtype_not_supported(
    exec_name: str, tensor: str, dtype: torch.dtype, allowed: Iterable[torch.dtype]
) -> str:
    allowed_s = "".join(f"{dt_name(d)}," for d in allowed)
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S") + f".{int(time.time() * 1e6) % 1000000:06d}"
    return (
        f"NPU function error: call {exec_name} failed, error code is {ACLNN_PARAM_INVALID}"
        + error_suffix(0, 100)
        + f"\n[PID: {os.getpid()}] {stamp} AclNN_Parameter_Error(EZ1001): Tensor {tensor} not implemented "
        f"for {dt_name(dtype)}, should be in dtype support list [{allowed_s}]."
    )


def param_invalid(exec_name: str, detail: str) -> str:
    """An aclnn parameter check that is not a dtype (shape, rank, layout): the same frame as EZ1001."""
    stamp = time.strftime("%Y-%m-%d-%H:%M:%S") + f".{int(time.time() * 1e6) % 1000000:06d}"
    return (
        f"NPU function error: call {exec_name} failed, error code is {ACLNN_PARAM_INVALID}"
        + error_suffix(0, 100)
        + f"\n[PID: {os.getpid()}] {stamp} AclNN_Parameter_Error(EZ1001): {detail}."
    )


def device_mismatch(first: torch.device | str, second: torch.device | str) -> str:
    return f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"


def numpy_on_device(device: str) -> str:
    return (f"can't convert {device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
            "memory first.")
