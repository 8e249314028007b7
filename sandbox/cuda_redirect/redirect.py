"""Device redirect for running the ORIGINAL model's semantics on the CPU in float32.

It does for cuda -> cpu what torch_npu's ``transfer_to_npu`` does for cuda -> npu: ``torch.cuda``
calls answer as if a device were there, ``.cuda()`` and ``device="cuda"`` land on the CPU, and CUDA
autocast is switched off (the reference is float32). CUDA-only libraries the original imports
unguarded are replaced by stubs (see ``stub_module``), submodules included, so that the import and
import-time uses (decorators, base classes, constants) do not stop the reference run; calling a stub on
tensors raises, naming the library. Streams, events, graphs and device properties are CPU objects with
the fields models read.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import tempfile
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from knowledge.errors import StubCalled
from sandbox.cuda_redirect.cpu_stand_ins import (
    eager_compile,
    install_cpu_stand_ins,
    pin_or_same,
    record_stream_or_skip,
)
from sandbox.cuda_redirect.cuda_only import LIBRARIES, STUB_ROOTS
from sandbox.cuda_redirect.sdpa import _npuport_sdpa_bshd

# Libraries that exist only for CUDA (one table: sandbox/cuda_redirect/cuda_only.py); an unguarded import of one of
# them is stubbed.
CUDA_ONLY_MODULES = STUB_ROOTS


class _StubAttr:
    """Any attribute of a stubbed module: a decorator hands the function back (``@triton.jit``), a
    decorator factory or config object is inert (``triton.autotune(configs=...)``), it can be a base class
    or be subscripted (``kernel[grid]``); calling it on tensors raises, naming the library."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, name: str) -> _StubAttr:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubAttr(f"{self._qualname}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        if any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
            raise StubCalled(
                f"{self._qualname} was called on tensors, but it belongs to a CUDA-only library that has no CPU "
                "implementation; the reference run stubs such libraries so the model's torch path can run"
            )
        return self

    def __getitem__(self, item: Any) -> _StubAttr:
        return self

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __bool__(self) -> bool:
        return False


def _flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                     softmax_scale: float | None = None, causal: bool = False, **kwargs: Any) -> torch.Tensor:
    if any(kwargs.get(k_) not in (None, False, (-1, -1)) for k_ in kwargs):
        raise StubCalled(f"flash_attn_func options {sorted(kwargs)} have no CPU reference implementation")
    return _npuport_sdpa_bshd(q, k, v, dropout_p, softmax_scale, causal)


def _xformers_mea(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: Any = None,
                  p: float = 0.0, scale: float | None = None, **_: Any) -> torch.Tensor:
    causal = isinstance(attn_bias, _StubAttr) and attn_bias._qualname.endswith("LowerTriangularMask")
    if attn_bias is not None and not causal:
        raise StubCalled("xformers attention with this attn_bias has no CPU reference implementation")
    return _npuport_sdpa_bshd(query, key, value, p, scale, causal)


# Functions of CUDA-only libraries with an exact torch definition: the reference run computes them on the
# CPU instead of stopping (what the library documents, not what its kernels do bit for bit).
CPU_REFERENCE: dict[str, Callable[..., Any]] = {
    "flash_attn.flash_attn_func": _flash_attn_func,
    "flash_attn.flash_attn_interface.flash_attn_func": _flash_attn_func,
    "xformers.ops.memory_efficient_attention": _xformers_mea,
    "xformers.ops.fmha.memory_efficient_attention": _xformers_mea,
}


def _module_getattr(qualname: str) -> Callable[[str], Any]:
    def getattr_(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)  # __file__, __spec__ ... : look like a plain module
        return CPU_REFERENCE.get(f"{qualname}.{attr}") or _StubAttr(f"{qualname}.{attr}")

    return getattr_


_stub_roots: set[str] = set()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves every submodule of a stubbed package (``import triton.language as tl``) to a stub."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in _stub_roots and fullname not in sys.modules:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _new_stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_FINDER = _StubFinder()


def _new_stub(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, f"npuport stub for the CUDA-only module {name}")
    mod.__path__ = []  # a package, so submodule imports resolve to stubs too
    mod.__getattr__ = _module_getattr(name)  # type: ignore[method-assign]
    mod.__npuport_stub__ = True  # type: ignore[attr-defined]
    # a spec, as an imported module has: importlib.util.find_spec(name) (transformers' availability checks)
    # raises "name.__spec__ is None" on a module in sys.modules without one
    mod.__spec__ = importlib.machinery.ModuleSpec(name, _FINDER, is_package=True)
    mod.__loader__ = _FINDER
    return mod


# The version a stubbed library's distribution answers with: past any minimum an import-time check asks for
# (``pkg_resources.get_distribution("flash-rwkv").parsed_version < parse_version("0.2.1")``), and marked a stub.
STUB_VERSION = "9999+npuport.stub"


def _stub_distributions(root: str) -> None:
    """Package metadata for a stubbed library's distributions (sandbox/cuda_redirect/cuda_only.py's table), visible to
    importlib.metadata and pkg_resources: code that checks the package's version at import (and re-raises
    a failed check as ImportError) imports as it would where the CUDA package is installed. The stub's
    functions still raise when called on tensors."""
    dists = sorted({d for lib in LIBRARIES if lib.module.split(".")[0] == root for d in lib.dists})
    if not dists:
        return
    folder = tempfile.mkdtemp(prefix="npuport-stub-dists-")
    for dist in dists:
        info = os.path.join(folder, f"{dist.replace('-', '_')}-{STUB_VERSION}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {STUB_VERSION}\n"
                    f"Summary: npuport stub for the CUDA-only {root} (reference run only)\n")
    sys.path.append(folder)
    pkg_resources = sys.modules.get("pkg_resources")
    if pkg_resources is not None:  # its working set was built when it was imported
        pkg_resources.working_set.add_entry(folder)


def stub_module(name: str) -> types.ModuleType:
    """Register a stub package for ``name`` (and its parents) in sys.modules; its submodules import as
    stubs too, and its distributions answer package-metadata queries."""
    parts = name.split(".")
    if parts[0] not in _stub_roots:
        _stub_distributions(parts[0])
    _stub_roots.add(parts[0])
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub in sys.modules:
            continue
        sys.modules[sub] = _new_stub(sub)
        if i > 1:
            setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], sys.modules[sub])
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

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: Any = None) -> Any:
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
        install_cpu_stand_ins(cuda)
        torch.compile = eager_compile  # type: ignore[assignment]
        torch.Tensor.pin_memory = pin_or_same  # type: ignore[method-assign,assignment]
        torch.Tensor.record_stream = record_stream_or_skip  # type: ignore[method-assign,assignment]
    torch.autocast = autocast_cls  # type: ignore[misc,assignment]
    torch.cuda.amp.autocast = cuda_amp_autocast  # type: ignore[misc,assignment]
    _active = CudaRedirectMode(device)
    _active.__enter__()


# --- a single-process world for validation runs -------------------------------------------------------

class _DoneWork:
    """The handle an ``async_op=True`` collective returns: already complete (one rank has nothing to wait for)."""

    def wait(self, *_: Any, **__: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Any:
        fut: Any = torch.futures.Future()
        fut.set_result(None)
        return fut


def _copy_into(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst is not src:
        dst.copy_(src.reshape(dst.shape))


# What each collective means on a world of one rank: reductions, broadcasts and barriers leave the
# tensor as it is; gathers and scatters copy the one rank's part into place.
_ONE_RANK: dict[str, Callable[..., None]] = {
    "all_reduce": lambda *a, **k: None,
    "reduce": lambda *a, **k: None,
    "broadcast": lambda *a, **k: None,
    "barrier": lambda *a, **k: None,
    "monitored_barrier": lambda *a, **k: None,
    "broadcast_object_list": lambda *a, **k: None,
    "all_gather": lambda tensor_list, tensor, *a, **k: _copy_into(tensor_list[0], tensor),
    "all_gather_into_tensor": lambda out, inp, *a, **k: _copy_into(out, inp),
    "_all_gather_base": lambda out, inp, *a, **k: _copy_into(out, inp),
    "reduce_scatter": lambda out, inputs, *a, **k: _copy_into(out, inputs[0]),
    "reduce_scatter_tensor": lambda out, inp, *a, **k: _copy_into(out, inp),
    "_reduce_scatter_base": lambda out, inp, *a, **k: _copy_into(out, inp),
    "all_to_all_single": lambda out, inp, *a, **k: _copy_into(out, inp),
    "all_to_all": lambda outs, inps, *a, **k: _copy_into(outs[0], inps[0]),
    "gather": lambda tensor, gather_list=None, *a, **k: _copy_into(gather_list[0], tensor) if gather_list else None,
    "scatter": lambda tensor, scatter_list=None, *a, **k: _copy_into(tensor, scatter_list[0]) if scatter_list else None,
    "all_gather_object": lambda objs, obj, *a, **k: objs.__setitem__(0, obj),
}


def install_single_process_world() -> bool:
    """Validation runs are one process: ``init_process_group`` (any backend, ``env://`` without MASTER_ADDR)
    makes a world of size 1 over gloo and an in-memory store, and collectives on a world of one rank are
    what they mean there (all_reduce leaves the tensor as it is, all_gather copies it into place), also on
    device tensors gloo cannot carry. A real multi-process launch (WORLD_SIZE > 1) is left alone.
    Returns whether the world was installed."""
    import torch.distributed as dist

    if not dist.is_available() or getattr(dist, "_npuport_single_world", False):
        return False
    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
        return False
    original_init = dist.init_process_group

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None, world_size: int = -1,
                           rank: int = -1, store: Any = None, group_name: str = "", **_: Any) -> None:
        kwargs: dict[str, Any] = {"timeout": timeout} if timeout is not None else {}
        original_init(backend="gloo", store=dist.HashStore(), rank=0, world_size=1, **kwargs)

    def one_rank(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(original)

        def collective(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            group = bound.arguments.get("group")
            if dist.is_initialized() and dist.get_world_size(group) != 1:
                return original(*args, **kwargs)
            values = list(bound.arguments.values())
            _ONE_RANK[name](*values[:2])
            return _DoneWork() if bound.arguments.get("async_op") else None

        collective.__name__ = name
        collective.__doc__ = original.__doc__
        return collective

    dist.init_process_group = init_process_group  # type: ignore[assignment]
    for name in _ONE_RANK:
        if hasattr(dist, name):
            setattr(dist, name, one_rank(name, getattr(dist, name)))
    dist._npuport_single_world = True  # type: ignore[attr-defined]
    return True
