"""Which aten ops have an NPU kernel, and with which dtypes (op-support matrix or built-in policy)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .messages import parse_dtype

# Ops torch_npu implements in its own core (tensor metadata, copies, allocation): always on device,
# whether or not a matrix built from kernel symbols lists them.
CORE_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "_reshape_alias",
        "as_strided",
        "as_strided_",
        "alias",
        "detach",
        "detach_",
        "empty",
        "empty_strided",
        "empty_like",
        "resize_",
        "resize_as_",
        "set_",
        "copy_",
        "_copy_from",
        "_copy_from_and_resize",
        "_to_copy",
        "clone",
        "_local_scalar_dense",
        "lift_fresh",
        "lift_fresh_copy",
        "view_as_real",
        "view_as_complex",
        "_conj",
        "_neg_view",
        "unfold",
        "t",
        "transpose",
        "permute",
        "expand",
        "slice",
        "select",
        "squeeze",
        "unsqueeze",
        "split",
        "split_with_sizes",
        "unbind",
        "narrow",
        "diagonal",
        "contiguous",
        "_unsafe_index",
    }
)

# Ops that take a CPU tensor beside npu tensors on a real device (copies, CPU indices).
CROSS_DEVICE_OK = frozenset(
    {
        "copy_",
        "_copy_from",
        "_copy_from_and_resize",
        "_to_copy",
        "index",
        "index_put",
        "index_put_",
        "_index_put_impl_",
        "set_",
        "lift_fresh",
    }
)

# Complex dtypes: most aclnn kernels reject them; these accept complex64 (metadata, copies, basic
# arithmetic). Our own conservative table, documented in docs/ascend-sim.md.
COMPLEX_OK = CORE_OPS | frozenset({"add", "sub", "mul", "cat", "stack", "fill_", "zero_", "eq", "ne"})
COMPLEX_DTYPES = frozenset({torch.complex32, torch.complex64, torch.complex128})

# Built-in policy (no matrix given): every op has a kernel except these, which fall back on real
# torch_npu 2.x builds (checked against the 2.13.0 wheel's kernel symbols).
BUILTIN_FALLBACKS = frozenset({"isneginf", "isposinf", "linalg_lstsq"})

GENERIC_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)

_COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeImplicitAutograd")


@dataclass(slots=True)
class OpDecision:
    name: str  # as torch prints it: "aten::add.Tensor"
    base: str  # "add"
    supported: bool
    exec_name: str  # aclnn entry named in dtype errors
    dtypes: frozenset[torch.dtype] | None  # allow-list from the matrix, or None
    complex_ok: bool
    cross_device_ok: bool
    core: bool  # metadata/copy op: exempt from dtype allow-lists
    mutates: bool  # writes into an argument (in-place or out=)
    host_sync: bool  # data-dependent output shape: the host waits for the device
    fast: bool = False  # plain op: the dispatcher may take its lean path
    count: int = 0  # calls that reached the NPU dispatch key

    def __post_init__(self) -> None:
        self.fast = (
            self.supported
            and not self.mutates
            and not self.host_sync
            and not self.cross_device_ok
            and self.dtypes is None
            and self.base not in _SPECIAL
        )


_SPECIAL = frozenset(
    {
        "_local_scalar_dense",
        "copy_",
        "_to_copy",
        "empty_like",
        "new_empty",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty_strided",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "empty_strided",
        "empty",
    }
)

DATA_DEPENDENT = frozenset(
    {
        "nonzero",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "equal",
        "is_nonzero",
        "repeat_interleave",
    }
)


_EXEC_NAMES = {
    "_to_copy": "aclnnCast",
    "copy_": "aclnnInplaceCopy",
    "index": "aclnnIndex",
    "mm": "aclnnMm",
    "bmm": "aclnnBatchMatMul",
    "addmm": "aclnnAddmm",
}


def exec_name_for(base: str) -> str:
    if base in _EXEC_NAMES:
        return _EXEC_NAMES[base]
    inplace = base.endswith("_") and not base.startswith("_")
    core = base.strip("_")
    camel = "".join(p[:1].upper() + p[1:] for p in core.split("_") if p)
    return f"aclnn{'Inplace' if inplace else ''}{camel}"


@dataclass
class Policy:
    source: str  # matrix path or "builtin"
    ops: dict[str, dict[str, Any]]
    fallback_ops: frozenset[str]
    custom_ops: frozenset[str]
    builtin: bool
    allow_bf16: bool

    @classmethod
    def load(cls, matrix_path: str | None, allow_bf16: bool) -> Policy:
        if not matrix_path:
            return cls("builtin", {}, BUILTIN_FALLBACKS, frozenset(), True, allow_bf16)
        data = json.loads(Path(matrix_path).read_text())
        ops = {k: v for k, v in (data.get("ops") or {}).items() if isinstance(v, dict)}
        return cls(
            str(matrix_path),
            ops,
            frozenset(data.get("fallback_ops") or ()),
            frozenset(data.get("custom_ops") or ()),
            False,
            allow_bf16,
        )

    def generic_dtypes(self) -> tuple[torch.dtype, ...]:
        return (
            GENERIC_DTYPES if self.allow_bf16 else tuple(d for d in GENERIC_DTYPES if d is not torch.bfloat16)
        )

    def _supported(self, ns: str, base: str, key: str, printed: str) -> bool:
        if ns != "aten" or base in CORE_OPS:
            return True
        if key in self.fallback_ops or base in self.fallback_ops:
            return False
        if self.builtin:
            return True
        entry = self.ops.get(key)
        if entry is not None:
            return bool(entry.get("npu", True))
        if base.endswith("_") and base[:-1] + key[len(base) :] in self.ops:
            return True  # in-place variant of an op whose functional form has a kernel
        # Composite ops decompose on a real device before they reach the NPU dispatch key.
        return any(torch._C._dispatch_has_kernel_for_dispatch_key(printed, k) for k in _COMPOSITE_KEYS)

    def decide(self, func: torch._ops.OpOverload) -> OpDecision:
        qual = func._schema.name  # "aten::add"
        ns, _, base = qual.partition("::")
        overload = func._overloadname
        key = base if overload == "default" else f"{base}.{overload}"
        printed = qual if overload == "default" else f"{qual}.{overload}"
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        entry = self.ops.get(key) or {}
        supported = self._supported(ns, base, key, printed)
        raw = entry.get("dtypes")
        dtypes = None
        if isinstance(raw, list) and raw:
            parsed = {parse_dtype(str(x)) for x in raw}
            dtypes = frozenset(d for d in parsed if d is not None)
            if not self.allow_bf16:
                dtypes = dtypes - {torch.bfloat16}
        return OpDecision(
            name=printed,
            base=base,
            supported=supported,
            exec_name=str(entry.get("exec") or exec_name_for(base)),
            dtypes=dtypes,
            complex_ok=base in COMPLEX_OK or base.rstrip("_") in COMPLEX_OK,
            cross_device_ok=base in CROSS_DEVICE_OK,
            core=base in CORE_OPS,
            mutates=mutates,
            host_sync=base in DATA_DEPENDENT,
        )
