"""Bootstrap for the real ``npu`` target: imports torch_npu in the harness process.

Op statistics on a real NPU come from torch_npu's own warnings (the harness records them); the
emulator's per-op inventory is not available there.
"""

from __future__ import annotations

import os
from typing import Any


def install(options: dict[str, Any]) -> None:
    if options.get("strict"):
        os.environ["TORCH_NPU_FALLBACK_CPU_DISABLE"] = "1"
    import torch
    import torch_npu  # noqa: F401  (registers the npu device)

    torch.npu.set_device(0)  # type: ignore[attr-defined]


def op_report() -> dict[str, Any]:
    import torch

    return {
        "target": "npu",
        "device_name": torch.npu.get_device_name(0),  # type: ignore[attr-defined]
        "max_memory_allocated": int(torch.npu.max_memory_allocated()),  # type: ignore[attr-defined]
    }
