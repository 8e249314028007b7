"""CPU stand-ins for what models ask of ``torch.cuda`` beyond tensors: streams, events, graphs, device
properties, memory counters and NVTX markers, with the fields models read (installed by
sandbox/cuda_redirect/redirect.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import types
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CpuEvent:
    """torch.cuda.Event on the CPU: records wall-clock time."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: CpuEvent) -> float:
        if self._t is None or end._t is None:
            raise RuntimeError("Event was not recorded")
        return (end._t - self._t) * 1000.0


class CpuStream:
    """torch.cuda.Stream on the CPU: CPU work is already in order, so waits have nothing to do."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        ev = event or CpuEvent()
        ev.record(self)
        return ev

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def __enter__(self) -> CpuStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class CpuGraph:
    """torch.cuda.CUDAGraph on the CPU: the aten ops run under ``graph(g)`` are recorded with the tensors
    they read and wrote, and ``replay()`` runs them again on those same (static) tensors, copying each
    result into the tensor the capture produced, which is what replaying a captured device graph does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ops: list[tuple[Any, Any, Any, Any]] = []
        self._mode: Any = None

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        self._ops = []
        self._mode = _OpRecorder(self._ops)
        self._mode.__enter__()

    def capture_end(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    def replay(self) -> None:
        replay_ops(self._ops)

    def reset(self) -> None:
        self._ops = []

    def pool(self) -> None:
        return None


class _OpRecorder(TorchDispatchMode):
    def __init__(self, ops: list[tuple[Any, Any, Any, Any]]) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


def replay_ops(ops: list[tuple[Any, Any, Any, Any]]) -> None:
    """Run recorded ops again; a fresh result is copied into the tensor the capture produced, so later ops
    (which hold the captured tensors) and the model's static outputs see the new values."""
    import torch.utils._pytree as pytree

    with torch.no_grad():
        for func, args, kwargs, out in ops:
            new = func(*args, **kwargs)
            for old, fresh in zip(pytree.tree_leaves(out), pytree.tree_leaves(new), strict=False):
                if isinstance(old, torch.Tensor) and isinstance(fresh, torch.Tensor) and old is not fresh \
                        and old.shape == fresh.shape:
                    old.copy_(fresh)


class CpuGraphContext:
    def __init__(self, graph: CpuGraph | None = None, pool: Any = None, stream: Any = None, **_: Any) -> None:
        self.graph = graph

    def __enter__(self) -> CpuGraph | None:
        if self.graph is not None:
            self.graph.capture_begin()
        return self.graph

    def __exit__(self, *exc: Any) -> None:
        if self.graph is not None:
            self.graph.capture_end()


@dataclasses.dataclass
class CpuProperties:
    """What models read from torch.cuda.get_device_properties(), describing the host."""

    name: str = "cpu (npuport cuda->cpu redirect)"
    total_memory: int = 0
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 1
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


def cpu_properties(*_: Any, **__: Any) -> CpuProperties:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 16 * 1024**3
    return CpuProperties(total_memory=int(total), multi_processor_count=os.cpu_count() or 1)


def eager_compile(model: Any = None, **_: Any) -> Any:
    """torch.compile under the CPU reference: eager (the same numbers; graph modes such as
    "reduce-overhead" capture CUDA graphs, which need CUDA, and compiling costs minutes on small CPUs)."""
    return model if model is not None else (lambda fn: fn)


_original_pin = torch.Tensor.pin_memory


def pin_or_same(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Pinning needs an accelerator's allocator; on the CPU reference the values are the same unpinned."""
    try:
        return _original_pin(self, *args, **kwargs)
    except RuntimeError:
        return self


_original_record_stream = torch.Tensor.record_stream


def record_stream_or_skip(self: torch.Tensor, stream: Any) -> None:
    """A CPU tensor has no stream to record on (and the CPU stand-in stream is not a torch.Stream)."""
    if self.device.type != "cpu":
        _original_record_stream(self, stream)


def install_cpu_stand_ins(cuda: Any) -> None:
    cuda.Stream = CpuStream
    cuda.Event = CpuEvent
    cuda.CUDAGraph = CpuGraph
    cuda.graph = CpuGraphContext
    cuda.current_stream = lambda *a, **k: CpuStream()
    cuda.default_stream = lambda *a, **k: CpuStream()
    cuda.stream = lambda stream=None: stream if stream is not None else CpuStream()
    cuda.get_device_properties = cpu_properties
    cuda.get_device_capability = lambda *a, **k: (0, 0)
    cuda.mem_get_info = lambda *a, **k: (cpu_properties().total_memory,) * 2
    cuda.make_graphed_callables = lambda callables, *a, **k: callables
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, lambda *a, **k: 0)
    cuda.reset_peak_memory_stats = lambda *a, **k: None
    # profiler range markers: nothing to mark without CUDA's NVTX library
    cuda.nvtx = types.SimpleNamespace(range_push=lambda *a, **k: 0, range_pop=lambda *a, **k: 0,
                                      mark=lambda *a, **k: None, range=lambda *a, **k: contextlib.nullcontext())
