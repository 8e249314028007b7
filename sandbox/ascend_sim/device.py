"""ascend-sim's Python engine (the fallback when the native one cannot be built): the emulated `npu`
device as a wrapper tensor subclass over CPU tensors plus a dispatch-level guard.

Every aten op on an npu tensor reaches `NpuTensor.__torch_dispatch__`, which unwraps the CPU tensors,
applies the guard (device mix, dtype allow-lists, CPU fallback of ops without an NPU kernel), runs the
CPU kernel and wraps the results. Factory functions with device="npu" reach the PrivateUse1 kernels
registered below (empty / empty_strided / _copy_from), which is how `torch.randn(..., device="npu")`,
`x.to("npu")` and `Module.to("npu")` work without a TorchFunctionMode.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from typing import Any

import torch

from . import messages, runtime
from .half_matmul import RUN_AS
from .policy import COMPLEX_DTYPES, OpDecision
from .runtime import RT

_CPU = torch.device("cpu")
aten = torch.ops.aten

_ATTR = "_ascend_sim_decision"  # the cached OpDecision on each OpOverload object
_BAD: frozenset[torch.dtype] = COMPLEX_DTYPES  # dtypes that need a check on this chip (set by install)


class PythonEngine:
    """Engine protocol (runtime.Engine) for the wrapper-subclass device."""

    name = "python"

    def __init__(self) -> None:
        self.decided: list[tuple[Any, OpDecision]] = []

    def is_npu(self, t: Any) -> bool:
        return type(t) is NpuTensor

    def to_cpu(self, t: torch.Tensor) -> torch.Tensor:
        return t.elem  # type: ignore[attr-defined,no-any-return]

    def to_npu(self, t: torch.Tensor) -> torch.Tensor:
        return wrap(t)

    def op_counts(self) -> dict[str, int]:
        return {d.name: d.count for _, d in self.decided if d.count}

    def op_total(self) -> int:
        return sum(d.count for _, d in self.decided)

    def zero_counts(self) -> None:
        for _, d in self.decided:
            d.count = 0

    def forget_decisions(self) -> None:
        for func, _ in self.decided:
            with contextlib.suppress(AttributeError):
                delattr(func, _ATTR)
        self.decided = []

    def memory_allocated(self) -> int:
        """Bytes held by live npu tensors (approximation: walks the GC for NpuTensor storages)."""
        seen: set[int] = set()
        total = 0
        for obj in gc.get_objects():
            if type(obj) is NpuTensor:
                st = obj.elem.untyped_storage()
                ptr = st.data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    total += st.nbytes()
        self._peak = max(getattr(self, "_peak", 0), total)
        return total

    def max_memory_allocated(self) -> int:
        return max(getattr(self, "_peak", 0), self.memory_allocated())

    def reset_peak(self) -> None:
        self._peak = 0


ENGINE = PythonEngine()


def set_bad_dtypes(dtypes: frozenset[torch.dtype]) -> None:
    global _BAD
    _BAD = dtypes
    RT.bad = dtypes


class NpuTensor(torch.Tensor):
    """A tensor that reports device npu:0 and holds its data in a CPU tensor (`elem`)."""

    elem: torch.Tensor
    # Plain Tensor semantics for torch functions: only __torch_dispatch__ runs Python (lean).
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False) -> NpuTensor:
        return wrap(elem, requires_grad)

    # Traceable-subclass protocol: Module._apply swaps parameters for such tensors.
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], meta: Any, outer_size: Any, outer_stride: Any
    ) -> Any:
        return wrap(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        return dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        RT.rec.sync("repr")  # printing copies to the host
        body = torch._tensor_str._str(self.elem)
        extra = f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return body[:-1] + extra + ")"

    def numpy(self, *, force: bool = False) -> Any:  # type: ignore[override]
        raise TypeError(messages.numpy_on_device(str(self.device)))

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        raise TypeError(messages.numpy_on_device(str(self.device)))

    def tolist(self) -> Any:  # type: ignore[override]
        RT.rec.sync("tolist")
        return self.elem.tolist()

    def data_ptr(self) -> int:  # type: ignore[override]
        return self.elem.data_ptr()

    def untyped_storage(self) -> Any:  # type: ignore[override]
        return self.elem.untyped_storage()


_make = torch.Tensor._make_wrapper_subclass
_DEV: torch.device = torch.device("cpu")  # replaced by torch.device("npu", 0) in register()


def wrap(elem: torch.Tensor, requires_grad: bool = False) -> NpuTensor:
    t: NpuTensor = _make(
        NpuTensor,
        elem.size(),
        strides=elem.stride(),
        storage_offset=elem.storage_offset(),
        dtype=elem.dtype,
        device=_DEV,
        layout=elem.layout,
        requires_grad=requires_grad,
    )
    t.elem = elem
    return t


def _decide(func: Any) -> OpDecision:
    d = RT.policy.decide(func)
    setattr(func, _ATTR, d)
    ENGINE.decided.append((func, d))
    return d


def _warn_double(op: str) -> None:
    runtime.warn_double(op, depth=5)


def _check_dtype(d: OpDecision, t: torch.Tensor, pos: int, func: Any) -> None:
    runtime.check_dtype(d, t.dtype, runtime.arg_name(func, pos))



def _fallback(d: OpDecision) -> None:
    runtime.fallback(d, depth=5)


def _unwrap(a: Any, d: OpDecision, func: Any, pos: int, found: list[Any]) -> Any:
    """Unwrap one argument; found = [saw_npu, first_cpu_tensor]."""
    if type(a) is NpuTensor:
        found[0] = True
        if a.dtype in _BAD or d.dtypes is not None:
            _check_dtype(d, a, pos, func)
        return a.elem
    if isinstance(a, torch.Tensor):
        if a.dim() > 0 and found[1] is None:
            found[1] = a
        return a
    if type(a) is list or type(a) is tuple:
        if a and not isinstance(a[0], (torch.Tensor, type(None))) and not isinstance(a[-1], torch.Tensor):
            return a
        return type(a)(_unwrap(x, d, func, pos, found) for x in a)
    return a


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        d = getattr(func, _ATTR)
    except AttributeError:
        d = _decide(func)
    d.count += 1
    if d.fast and not kwargs:
        # Lean path: positional args, npu tensors and non-tensors only.
        uargs = []
        for a in args:
            if type(a) is NpuTensor:
                if a.dtype in _BAD:
                    return _dispatch_general(func, d, args, kwargs)
                uargs.append(a.elem)
            elif type(a) is list or type(a) is tuple or isinstance(a, torch.Tensor):
                return _dispatch_general(func, d, args, kwargs)
            else:
                uargs.append(a)
        out = RUN_AS.get(func, func._op)(*uargs)
        if type(out) is torch.Tensor and out.dtype is not torch.float64:
            t = _make(
                NpuTensor,
                out.size(),
                strides=out.stride(),
                storage_offset=out.storage_offset(),
                dtype=out.dtype,
                device=_DEV,
            )
            t.elem = out
            return t
        return _wrap_out(out, args, uargs, kwargs, d)
    return _dispatch_general(func, d, args, kwargs)


def _dispatch_general(func: Any, d: OpDecision, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rec = RT.rec
    found: list[Any] = [False, None]
    uargs = [_unwrap(a, d, func, i, found) for i, a in enumerate(args)]
    ukwargs = {k: _unwrap(v, d, func, -1, found) for k, v in kwargs.items()} if kwargs else {}
    if found[1] is not None and found[0] and not d.cross_device_ok:
        raise RuntimeError(messages.device_mismatch(_DEV, found[1].device))

    out_dt = ukwargs.get("dtype")
    if out_dt is not None and out_dt in _BAD:
        runtime.check_out_dtype(d, out_dt)
    to_host = False
    dev = ukwargs.get("device")
    if dev is not None:
        dev = torch.device(dev) if not isinstance(dev, torch.device) else dev
        if dev.type == "npu":
            ukwargs["device"] = _CPU
        elif dev.type == "cpu":
            to_host = True
    if not d.supported:
        _fallback(d)
    if d.host_sync:
        rec.sync(d.base)

    if func is _COPY_:
        return _copy(args, uargs, ukwargs)
    out = RUN_AS.get(func, func._op)(*uargs, **ukwargs)

    if to_host:
        if d.base == "_to_copy":
            rec.sync("d2h")
        return out
    if func is _LOCAL_SCALAR:
        rec.sync("item")
        return out
    return _wrap_out(out, args, uargs, kwargs, d)


_COPY_ = aten.copy_.default
_LOCAL_SCALAR = aten._local_scalar_dense.default


def _copy(args: Any, uargs: list[Any], ukwargs: dict[str, Any]) -> Any:
    dst = args[0]
    if type(dst) is not NpuTensor:  # device -> host copy into a CPU tensor
        RT.rec.sync("d2h")
        dst.copy_(uargs[1], **ukwargs)
        return dst
    dst.elem.copy_(uargs[1], **ukwargs)
    return dst


def _wrap_out(out: Any, args: Any, uargs: list[Any], kwargs: dict[str, Any], d: OpDecision) -> Any:
    if isinstance(out, torch.Tensor):
        if d.mutates:  # in-place / out=: hand back the caller's npu tensor
            for a in (*args, *kwargs.values()):
                if type(a) is NpuTensor and a.elem is out:
                    _sync_meta(a)
                    return a
        if out.dtype is torch.float64:
            _warn_double(d.name)
            out = out.float()
        return wrap(out)
    if type(out) is tuple or type(out) is list:
        return type(out)(_wrap_out(o, args, uargs, kwargs, d) for o in out)
    return out


_SET_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _sync_meta(w: NpuTensor) -> None:
    """After in-place/out= resizing, make the wrapper's sizes follow its CPU tensor."""
    e = w.elem
    if w.shape != e.shape or w.stride() != e.stride() or w.storage_offset() != e.storage_offset():
        aten.set_.source_Storage_storage_offset.redispatch(
            _SET_CPU, w, torch._C.TensorBase.untyped_storage(w), e.storage_offset(), e.shape, e.stride()
        )


# --- PrivateUse1 kernels: allocation and host->device copies reach the backend key directly ---------


def _factory_dtype(dtype: torch.dtype | None) -> torch.dtype | None:
    if dtype is torch.float64:
        _warn_double("aten::empty")
        return torch.float32
    if dtype is None and torch.get_default_dtype() is torch.float64:
        _warn_double("aten::empty")
        return torch.float32
    return dtype


def _count(func: Any) -> None:
    try:
        d = getattr(func, _ATTR)
    except AttributeError:
        d = _decide(func)
    d.count += 1


def _empty_memory_format(
    size: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> torch.Tensor:
    _count(aten.empty.memory_format)
    dt = _factory_dtype(dtype)
    _check_factory_dtype(dt)
    return wrap(torch.empty(size, dtype=dt, memory_format=memory_format or torch.contiguous_format))


def _empty_strided(
    size: Any,
    stride: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> torch.Tensor:
    _count(aten.empty_strided.default)
    dt = _factory_dtype(dtype)
    _check_factory_dtype(dt)
    return wrap(torch.empty_strided(size, stride, dtype=dt))


def _check_factory_dtype(dt: torch.dtype | None) -> None:
    # Allocation itself succeeds for every dtype on a real device; kernels reject later. Nothing to do.
    return None


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _count(aten._copy_from.default)
    s = src.elem if type(src) is NpuTensor else src
    if type(dst) is NpuTensor:
        dst.elem.copy_(s)
    else:
        RT.rec.sync("d2h")
        dst.copy_(s)
    return dst


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    s = src.elem if type(src) is NpuTensor else src
    if type(dst) is NpuTensor:
        dst.elem.resize_(s.shape).copy_(s)
        _sync_meta(dst)
    else:
        dst.resize_(s.shape).copy_(s)
    return dst


_LIBS: list[Any] = []


def register(device_module: Any) -> None:
    """Make "npu" a device of this process (idempotent)."""
    global _DEV
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    if torch._C._get_privateuse1_backend_name() != "npu":
        _setup_privateuseone_for_python_backend("npu", backend_module=device_module)
    _DEV = torch.device("npu", 0)
    if _LIBS:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    _LIBS.append(lib)
    register_autocast()


def register_autocast() -> None:
    """torch.autocast(device_type="npu") for the Python engine (idempotent; the native engine's library
    registers its own, in C++)."""
    if _AUTOCAST_LIBS:
        return
    lib = torch.library.Library("aten", "IMPL")
    _register_autocast(lib)
    glob = torch.library.Library("_", "IMPL")
    glob.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _AUTOCAST_LIBS.extend([lib, glob])


_AUTOCAST_LIBS: list[Any] = []


# Autocast on npu: the ops that run in the lower precision under torch.autocast(device_type="npu").
_AUTOCAST_LOWER = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "addbmm",
    "matmul",
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "convolution",
    "_convolution",
    "addmv",
    "mv",
    "prelu",
    "conv_transpose2d",
)


AUTOCAST_OVERLOADS = ("default", "padding", "deprecated", "input")


def _register_autocast(lib: Any) -> None:
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined]
    for name in _AUTOCAST_LOWER:
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        for ov in packet.overloads():
            if ov not in AUTOCAST_OVERLOADS:
                continue  # out= and out_dtype variants run as called, as under CUDA's and torch_npu's autocast
            op = getattr(packet, ov)
            qual = name if ov == "default" else f"{name}.{ov}"
            lib.impl(qual, _autocast_kernel(op, exclude), "AutocastPrivateUse1")


def _autocast_kernel(op: Any, exclude: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dt = torch.get_autocast_dtype("npu")

        def cast(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype is not dt:
                return x.to(dt)
            return x

        with torch._C._ExcludeDispatchKeyGuard(exclude):
            return op(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    return kernel
