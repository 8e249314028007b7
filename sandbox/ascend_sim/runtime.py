"""State and guard events shared by both engines of the emulated npu device.

An engine (sandbox/ascend_sim/device.py: Python tensor subclass; native_engine.py: C++ PrivateUse1
backend) decides *where* tensors live and how ops run; this module decides *what the emulated torch_npu
host says*: CPU-fallback warnings and strict-mode errors, float64 downcasts, dtype errors, host syncs.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol

import torch

from . import messages
from .policy import COMPLEX_DTYPES, OpDecision, Policy
from .profiles import ChipProfile
from .state import Recorder


class Engine(Protocol):
    """How npu tensors are represented and counted."""

    name: str

    def is_npu(self, t: Any) -> bool: ...
    def to_cpu(self, t: torch.Tensor) -> torch.Tensor: ...  # same memory, no copy
    def to_npu(self, t: torch.Tensor) -> torch.Tensor: ...  # same memory, no copy
    def op_counts(self) -> dict[str, int]: ...
    def op_total(self) -> int: ...  # sum of op_counts(), cheap: read at every step boundary
    def zero_counts(self) -> None: ...
    def forget_decisions(self) -> None: ...
    def memory_allocated(self) -> int: ...
    def max_memory_allocated(self) -> int: ...
    def reset_peak(self) -> None: ...


class _Runtime:
    """Mutable configuration of the installed emulator."""

    policy: Policy
    profile: ChipProfile
    strict: bool
    rec: Recorder
    engine: Engine

    def __init__(self) -> None:
        self.custom_counts: dict[str, int] = {}
        self.strict = False
        self.bad: frozenset[torch.dtype] = COMPLEX_DTYPES  # dtypes that need a check on this chip
        self.rec = self.new_recorder()

    def new_recorder(self) -> Recorder:
        rec = Recorder()
        rec.count_ops = self.count_ops
        rec.op_counts = self.op_counts
        return rec

    def op_counts(self) -> dict[str, int]:
        engine = getattr(self, "engine", None)
        out = dict(engine.op_counts()) if engine is not None else {}
        out.update({k: v for k, v in self.custom_counts.items() if v})
        return out

    def count_ops(self) -> int:
        engine = getattr(self, "engine", None)
        return (engine.op_total() if engine is not None else 0) + sum(self.custom_counts.values())

    def forget_decisions(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.forget_decisions()
        self.custom_counts.clear()

    def zero_counts(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.zero_counts()
        self.custom_counts.clear()


RT = _Runtime()


def warn_double(op: str, depth: int = 4) -> None:
    rec = RT.rec
    rec.dtype_event("double_downcast", op, "DT_DOUBLE", depth=depth)
    if not rec.double_warned:
        rec.double_warned = True
        rec.warnings.append(messages.DOUBLE_WARNING)
        warnings.warn(messages.DOUBLE_WARNING, UserWarning, stacklevel=depth)


def dtype_error(d: OpDecision, arg: str, dtype: torch.dtype) -> RuntimeError:
    allowed = d.dtypes if d.dtypes is not None else RT.policy.generic_dtypes()
    generic = RT.policy.generic_dtypes()
    order = [x for x in generic if x in allowed] + sorted((x for x in allowed if x not in generic), key=str)
    RT.rec.dtype_event("dtype_error", d.name, messages.dt_name(dtype), depth=5)
    return RuntimeError(messages.dtype_not_supported(d.exec_name, arg, dtype, order))


def arg_name(func: Any, pos: int) -> str:
    """The schema name of argument `pos` of an OpOverload, as dtype errors name it."""
    args = func._schema.arguments
    return str(args[pos].name) if 0 <= pos < len(args) else "self"


def check_dtype(d: OpDecision, dt: torch.dtype, arg: str) -> None:
    """Raise the EZ1001 error when an input of this dtype has no kernel for this op on this chip."""
    if d.dtypes is not None and not d.core:
        if dt not in d.dtypes:
            raise dtype_error(d, arg, dt)
        return
    if dt in RT.bad:
        if dt in COMPLEX_DTYPES:
            if d.complex_ok:
                return
        elif d.core and d.base != "_to_copy":  # no-bf16 chip: metadata/copies still work
            return
        raise dtype_error(d, arg, dt)


def check_out_dtype(d: OpDecision, dt: torch.dtype) -> None:
    """An op asked to produce `dt` (its dtype= argument)."""
    if dt in RT.bad and (not d.core or d.base == "_to_copy") and not (dt in COMPLEX_DTYPES and d.complex_ok):
        raise dtype_error(d, "out", dt)


def fallback(d: OpDecision, depth: int = 4) -> None:
    """An op without an NPU kernel: strict mode raises; otherwise warn once and count the call site."""
    if RT.strict:
        raise RuntimeError(messages.fallback_disabled(d.name))
    rec = RT.rec
    rec.fallback(d.name, depth=depth)
    if d.name not in rec.fallback_warned:
        rec.fallback_warned.add(d.name)
        msg = messages.fallback_warning(d.name)
        rec.warnings.append(msg)
        warnings.warn(msg, UserWarning, stacklevel=depth)
