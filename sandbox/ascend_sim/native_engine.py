"""The native engine: the npu device as a C++ PrivateUse1 backend (native/ascend_sim_native.cpp).

npu tensors are plain torch.Tensors on device npu:0 whose memory is CPU memory; every aten op reaches
one C++ kernel that runs the CPU kernel on aliases of the same memory. The C++ side calls back into
`_Hooks` (below) only for the porting policy: the first call of each operator (decide), ops without an
NPU kernel, dtype problems, float64 results and host syncs. See docs/ascend-sim.md.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import messages, runtime
from .policy import OpDecision
from .runtime import RT

_LOADED: ModuleType | None = None
_REGISTERED = False
_COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def load(lib_path: str) -> ModuleType:
    """Import the compiled engine (once per process)."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    path = Path(lib_path)
    if not path.is_file():
        raise RuntimeError(f"ascend-sim native engine not found at {path}")
    name = path.name.split(".")[0]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    if spec is None:
        raise RuntimeError(f"cannot load the ascend-sim native engine from {path}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    _LOADED = mod
    return mod


def _overload(name: str) -> Any:
    """aten::add.Tensor -> torch.ops.aten.add.Tensor."""
    qual, _, overload = name.partition(".")
    ns, _, base = qual.partition("::")
    return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")


class _Hooks:
    """Answers the C++ kernel. Exceptions raised here reach the model's code unchanged."""

    def __init__(self) -> None:
        self.decisions: dict[str, OpDecision] = {}

    def decide(self, name: str) -> tuple[bool, str, bool, list[torch.dtype] | None]:
        d = RT.policy.decide(_overload(name))
        self.decisions[name] = d
        sync = "item" if d.base == "_local_scalar_dense" else (d.base if d.host_sync else "")
        allow = sorted(d.dtypes, key=str) if d.dtypes is not None and not d.core else None
        return d.supported, sync, d.cross_device_ok, allow

    def check_dtype(self, name: str, pos: int, dtype: torch.dtype) -> None:
        runtime.check_dtype(self.decisions[name], dtype, runtime.arg_name(_overload(name), pos))

    def check_out_dtype(self, name: str, dtype: torch.dtype) -> None:
        runtime.check_out_dtype(self.decisions[name], dtype)

    def fallback(self, name: str) -> None:
        runtime.fallback(self.decisions[name], depth=3)

    def double(self, name: str) -> None:
        runtime.warn_double(name, depth=3)

    def sync(self, kind: str) -> None:
        RT.rec.sync(kind, depth=3)

    def device_mismatch(self, other: str) -> None:
        raise RuntimeError(messages.device_mismatch("npu:0", other))


class NativeEngine:
    """Engine protocol (runtime.Engine) over the compiled module."""

    name = "native"

    def __init__(self, mod: ModuleType) -> None:
        self.mod = mod
        self.hooks = _Hooks()

    def is_npu(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == "npu"

    def to_cpu(self, t: torch.Tensor) -> torch.Tensor:
        return self.mod.to_cpu(t)  # type: ignore[no-any-return]

    def to_npu(self, t: torch.Tensor) -> torch.Tensor:
        return self.mod.to_npu(t)  # type: ignore[no-any-return]

    def op_counts(self) -> dict[str, int]:
        return dict(self.mod.op_counts())

    def op_total(self) -> int:
        return int(self.mod.op_total())

    def zero_counts(self) -> None:
        self.mod.zero_counts()

    def forget_decisions(self) -> None:
        self.mod.forget_decisions()
        self.hooks.decisions.clear()

    def memory_allocated(self) -> int:
        return int(self.mod.memory_allocated())

    def max_memory_allocated(self) -> int:
        return int(self.mod.max_memory_allocated())

    def reset_peak(self) -> None:
        self.mod.reset_peak()


def install(lib_path: str, device_module: Any) -> NativeEngine:
    """Load the engine and make "npu" this process's PrivateUse1 device (idempotent)."""
    global _REGISTERED
    mod = load(lib_path)
    engine = getattr(RT, "engine", None)
    if not isinstance(engine, NativeEngine):
        engine = NativeEngine(mod)
    mod.set_hooks(engine.hooks)
    mod.set_bad_dtypes(sorted(RT.bad, key=str))
    if not _REGISTERED:
        from torch.utils.backend_registration import _DummyPrivateUse1Hook

        torch.utils.rename_privateuse1_backend("npu")
        torch.utils.generate_methods_for_privateuse1_backend()
        torch._register_device_module("npu", device_module)
        torch._C._acc.register_python_privateuseone_hook(_DummyPrivateUse1Hook())
        # Ops whose composite kernel would otherwise win over the backend fallback: route them to the
        # kernel too, so the guard sees the same ops a torch_npu build dispatches to its device.
        names = [
            n.removeprefix("aten::")
            for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("aten::")
            and any(torch._C._dispatch_has_kernel_for_dispatch_key(n, k) for k in _COMPOSITE_KEYS)
            and not torch._C._dispatch_has_kernel_for_dispatch_key(n, "PrivateUse1")
        ]
        mod.register_kernels(names)
        # torch.autocast(device_type="npu") is registered by the library itself (C++ kernels)
        _REGISTERED = True
    return engine
