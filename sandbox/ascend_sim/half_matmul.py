"""Half-precision matmuls as the Cube unit computes them, for the Python engine (sandbox/ascend_sim/device.py):
fp16/bf16 operands, fp32 accumulation, one rounding to the operands' dtype. The CPU's own half kernels take
3-5x the float time on a prefill; fewer rows (a decode step) stay on them, where converting the weight would
cost more than it saves. The native engine does the same in C++ (ascend_sim_native.cpp, kHalfViaFloatRows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

HALF_VIA_FLOAT_ROWS = 16
_HALF = (torch.float16, torch.bfloat16)


def _half_via_float(op: Any, mats: tuple[int, int], rows: Callable[[torch.Tensor], int], bias: int | None) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        x, w = args[mats[0]], args[mats[1]]
        if x.dtype not in _HALF or w.dtype is not x.dtype or rows(x) < HALF_VIA_FLOAT_ROWS or kwargs.get("out") \
                is not None or (bias is not None and args[bias].dtype is not x.dtype):
            return op(*args, **kwargs)
        up = [a.float() if i in (*mats, bias) else a for i, a in enumerate(args)]
        return op(*up, **kwargs).to(x.dtype)
    return run


RUN_AS: dict[Any, Any] = {
    aten.mm.default: _half_via_float(aten.mm.default._op, (0, 1), lambda x: x.shape[0], None),
    aten.bmm.default: _half_via_float(aten.bmm.default._op, (0, 1), lambda x: x.shape[0] * x.shape[1], None),
    aten.addmm.default: _half_via_float(aten.addmm.default._op, (1, 2), lambda x: x.shape[0], 0),
}
