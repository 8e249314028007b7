"""Device redirect for running the ORIGINAL model's semantics on the CPU in float32.

It does for cuda -> cpu what torch_npu's ``transfer_to_npu`` does for cuda -> npu: ``torch.cuda``
calls answer as if a device were there, ``.cuda()`` and ``device="cuda"`` land on the CPU, and CUDA
autocast is switched off (the reference is float32). CUDA-only libraries the original imports
unguarded are replaced by stubs (see ``stub_module``) so that an unused import does not stop the
reference run; calling anything in a stub raises, naming the library.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from sandbox.cuda_only import STUB_ROOTS

# Libraries that exist only for CUDA (one table: sandbox/cuda_only.py); an unguarded import of one of
# them is stubbed.
CUDA_ONLY_MODULES = STUB_ROOTS


class StubCalled(RuntimeError):
    pass


class _StubAttr:
    """Any attribute of a stubbed module: callable, subscriptable, usable as a decorator target."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, name: str) -> _StubAttr:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubAttr(f"{self._qualname}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StubCalled(
            f"{self._qualname} was called, but it belongs to a CUDA-only library that has no CPU "
            "implementation; the reference run stubs such libraries only for unused imports"
        )

    def __getitem__(self, item: Any) -> _StubAttr:
        return self


def _module_getattr(qualname: str) -> Callable[[str], _StubAttr]:
    def getattr_(attr: str) -> _StubAttr:
        if attr.startswith("__"):
            raise AttributeError(attr)  # __file__, __spec__ ... : look like a plain module
        return _StubAttr(f"{qualname}.{attr}")

    return getattr_


def stub_module(name: str) -> types.ModuleType:
    """Register a stub package for ``name`` (and its parents) in sys.modules."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub in sys.modules:
            continue
        mod = types.ModuleType(sub, f"npuport stub for the CUDA-only module {sub}")
        mod.__path__ = []  # a package, so submodule imports resolve to stubs too
        mod.__getattr__ = _module_getattr(sub)  # type: ignore[method-assign]
        mod.__npuport_stub__ = True  # type: ignore[attr-defined]
        sys.modules[sub] = mod
        if i > 1:
            setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], mod)
    return sys.modules[name]


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return False


class CudaRedirectMode(TorchFunctionMode):
    """Rewrites every ``device=`` argument (and ``Tensor.to``'s positional device) from cuda to the
    redirect's device."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = torch.device(device)

    def _map(self, device: Any) -> Any:
        return self.device if _is_cuda(device) else device

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = self._map(kwargs["device"])
        if args and func in (torch.Tensor.to, torch.Tensor.new_empty, torch.Tensor.new_zeros):
            args = tuple(self._map(a) if i > 0 else a for i, a in enumerate(args))
        return func(*args, **kwargs)


_OriginalAutocast = torch.autocast


def _autocast_class(device: str) -> type:
    class RedirectedAutocast(_OriginalAutocast):  # type: ignore[misc,valid-type]
        """CUDA autocast: switched off for the CPU reference (its numbers are float32), moved to the
        NPU as transfer_to_npu does."""

        def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                     cache_enabled: bool | None = None) -> None:
            if device_type == "cuda" and device == "cpu":
                super().__init__("cpu", dtype=torch.bfloat16, enabled=False)
            elif device_type == "cuda":
                super().__init__(device, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
            else:
                super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return RedirectedAutocast


_active: CudaRedirectMode | None = None


def install(device: str = "cpu") -> None:
    """Install the redirect cuda -> ``device`` ("cpu" for the reference run, "npu" for the op
    inventory of an unported model, like torch_npu's transfer_to_npu) for the rest of this process."""
    global _active
    if _active is not None:
        return
    autocast_cls = _autocast_class(device)

    def tensor_cuda(self: torch.Tensor, device_: Any = None, non_blocking: bool = False, **_: Any) -> torch.Tensor:
        return self.to(device, non_blocking=non_blocking)

    def module_cuda(self: torch.nn.Module, device_: Any = None) -> torch.nn.Module:
        return self.to(device)

    def cuda_amp_autocast(enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> Any:
        return autocast_cls("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.Tensor.cuda = tensor_cuda  # type: ignore[method-assign,assignment]
    torch.nn.Module.cuda = module_cuda  # type: ignore[method-assign,assignment]
    cuda = torch.cuda
    npu = getattr(torch, "npu", None) if device == "npu" else None
    if npu is not None:
        for name in ("is_available", "device_count", "current_device", "set_device", "synchronize", "empty_cache",
                     "manual_seed", "manual_seed_all", "get_device_name", "is_bf16_supported"):
            if hasattr(npu, name):
                setattr(cuda, name, getattr(npu, name))
    else:
        cuda.is_available = lambda: True  # type: ignore[assignment]
        cuda.device_count = lambda: 1  # type: ignore[assignment]
        cuda.current_device = lambda: 0  # type: ignore[assignment]
        cuda.set_device = lambda *a, **k: None  # type: ignore[assignment]
        cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
        cuda.empty_cache = lambda: None  # type: ignore[assignment]
        cuda.manual_seed = lambda seed: None  # type: ignore[assignment]
        cuda.manual_seed_all = lambda seed: None  # type: ignore[assignment]
        cuda.get_device_name = lambda *a, **k: "cpu (npuport cuda->cpu redirect)"  # type: ignore[assignment]
        cuda.is_bf16_supported = lambda *a, **k: True  # type: ignore[assignment]
    torch.autocast = autocast_cls  # type: ignore[misc,assignment]
    torch.cuda.amp.autocast = cuda_amp_autocast  # type: ignore[misc,assignment]
    _active = CudaRedirectMode(device)
    _active.__enter__()
