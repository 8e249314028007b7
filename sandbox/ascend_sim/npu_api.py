"""`torch.npu` and `torch_npu` modules: the API surface ported code calls, backed by the emulator (the fused
`torch_npu.npu_*` ops are in custom_ops.py)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import custom_ops, messages, surface
from .runtime import RT

_DEVICE_STATE = {"current": 0}


# --- device API (torch.npu.*) -------------------------------------------------------------------------


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    d = torch.device(device) if not isinstance(device, torch.device) else device
    return d.index or 0


def set_device(device: Any) -> None:
    idx = _index(device)
    if idx != 0:
        # The format a real host gives for a bad device id (torch_npu error-code suffix).
        raise RuntimeError(
            "Initialize: NPU function error: c10_npu::SetDevice(device_id_), error code is 107001"
            + messages.error_suffix(0, 100)
            + f"\n[Error]: Invalid device ID. set drv device={idx}, valid device range is [0, 1)"
        )
    _DEVICE_STATE["current"] = idx


def current_device() -> int:
    return int(_DEVICE_STATE["current"])


def synchronize(device: Any = None) -> None:
    RT.rec.sync("synchronize", depth=3)


def empty_cache() -> None:
    return None


def get_device_name(device: Any = None) -> str:
    return RT.profile.device_name


class _Props:
    def __init__(self) -> None:
        p = RT.profile
        self.name = p.device_name
        self.total_memory = p.memory_gib * 1024**3
        self.cube_core_num = p.ai_cores
        self.vector_core_num = p.ai_cores * 2
        # torch_npu fills only the fields above (and L2_cache_size); CUDA's others come back empty
        self.L2_cache_size = 0
        self.major = self.minor = self.multi_processor_count = None

    def __repr__(self) -> str:
        return f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // 1024**2}MB)"


def get_device_properties(device: Any = None) -> _Props:
    return _Props()


def get_device_capability(device: Any = None) -> None:
    return None  # real torch_npu returns None too


def memory_allocated(device: Any = None) -> int:
    """Bytes held by live npu tensors."""
    return RT.engine.memory_allocated()


def max_memory_allocated(device: Any = None) -> int:
    return RT.engine.max_memory_allocated()


def memory_reserved(device: Any = None) -> int:
    return memory_allocated()


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated()


def reset_peak_memory_stats(device: Any = None) -> None:
    RT.engine.reset_peak()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    total = RT.profile.memory_gib * 1024**3
    return total - memory_allocated(), total


def manual_seed(seed: int) -> None:
    # npu tensors draw from the CPU generator here. Not torch.manual_seed: that calls back into
    # torch.npu.manual_seed_all.
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.seed()


def initial_seed() -> int:
    return torch.initial_seed()


# torch_npu's SocVersion numbering (vllm-ascend reads A2 as 220-225, A3 as 250-255, 310P as 200-205).
_SOC_VERSION = {"Ascend910B3": 223, "Ascend910_9392": 251, "Ascend310P3": 202}


def get_soc_version() -> int:
    return _SOC_VERSION.get(RT.profile.device_name, 223)


def memory_stats(device: Any = None) -> dict[str, int]:
    """The allocated-bytes counters only: there is no caching allocator to report on."""
    cur, peak = memory_allocated(), max_memory_allocated()
    return {
        "allocated_bytes.all.current": cur,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": cur,
        "reserved_bytes.all.peak": peak,
    }


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()  # npu tensors draw from the CPU generator here


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(new_state)


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    set_rng_state(new_states[0])


def is_bf16_supported() -> bool:
    return RT.profile.bf16


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16] if RT.profile.bf16 else [torch.float16]


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def set_compile_mode(jit_compile: bool = False) -> None:
    return None  # kernels here are CPU kernels; nothing to compile


@contextlib.contextmanager
def device(idx: Any) -> Iterator[None]:
    prev = current_device()
    set_device(idx)
    try:
        yield
    finally:
        _DEVICE_STATE["current"] = prev


class Event:
    """Host-clock event: elapsed_time measures CPU execution (no async device here)."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, end: Event) -> float:
        if self._t is None or end._t is None:
            raise RuntimeError("Event was not recorded")
        return (end._t - self._t) * 1000.0


class Stream:
    def __init__(self, device: Any = None, priority: int = 0) -> None:
        self.device_index = 0

    @property
    def device(self) -> torch.device:
        return torch.device("npu", 0)

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, other: Stream) -> None:
        return None

    def wait_event(self, event: Event) -> None:
        return None

    def record_event(self, event: Event | None = None) -> Event:
        ev = event or Event()
        ev.record()
        return ev

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = Stream()


def current_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


def default_stream(device: Any = None) -> Stream:
    return _DEFAULT_STREAM


@contextlib.contextmanager
def stream(s: Any) -> Iterator[None]:
    yield


def _autocast(enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> Any:
    return torch.autocast(device_type="npu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _GradScaler(torch.amp.GradScaler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("device", None)
        super().__init__("npu", *args, **kwargs)


_API = (
    "is_available",
    "device_count",
    "set_device",
    "current_device",
    "synchronize",
    "empty_cache",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "mem_get_info",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "initial_seed",
    "get_rng_state",
    "get_rng_state_all",
    "set_rng_state",
    "set_rng_state_all",
    "memory_stats",
    "get_soc_version",
    "is_bf16_supported",
    "get_amp_supported_dtype",
    "is_initialized",
    "_is_in_bad_fork",
    "set_compile_mode",
    "device",
    "Event",
    "Stream",
    "current_stream",
    "default_stream",
    "stream",
)


def _build_npu(mod: types.ModuleType) -> None:
    """torch_npu.npu, which torch_npu registers as torch.npu."""
    for name in _API:
        setattr(mod, name, globals()[name])
    mod.config = types.SimpleNamespace(allow_internal_format=False)  # type: ignore[attr-defined]
    mod.matmul = types.SimpleNamespace(allow_hf32=False)  # type: ignore[attr-defined]
    mod.conv = types.SimpleNamespace(allow_hf32=True)  # type: ignore[attr-defined]
    for sub in ("amp", "random", "memory"):
        importlib.import_module(f"torch_npu.npu.{sub}")


_RANDOM_API = ("manual_seed", "manual_seed_all", "seed", "initial_seed", "get_rng_state", "get_rng_state_all",
               "set_rng_state", "set_rng_state_all")
_MEMORY_API = ("empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
               "max_memory_reserved", "reset_peak_memory_stats", "mem_get_info", "memory_stats")


def _build_random(mod: types.ModuleType) -> None:
    for name in _RANDOM_API:
        setattr(mod, name, globals()[name])


def _build_memory(mod: types.ModuleType) -> None:
    for name in _MEMORY_API:
        setattr(mod, name, globals()[name])


def _build_amp(mod: types.ModuleType) -> None:
    mod.autocast = _autocast  # type: ignore[attr-defined]
    mod.GradScaler = _GradScaler  # type: ignore[attr-defined]


# --- torch_npu: fused ops (custom_ops.py), optimizers, submodules ------------------------------------


class NpuFusedAdamW(torch.optim.AdamW):
    """torch_npu.optim.NpuFusedAdamW: AdamW with the parameters fused into one buffer on a device; the
    update rule is AdamW's, which is what the emulator runs."""


class NpuFusedAdam(torch.optim.Adam):
    """torch_npu.optim.NpuFusedAdam (see NpuFusedAdamW)."""


def _build_root(mod: types.ModuleType) -> None:
    version = surface.finder().version  # type: ignore[union-attr]
    mod.__version__ = version  # type: ignore[attr-defined]
    mod._ascend_sim = True  # type: ignore[attr-defined]
    mod.__file__ = __file__  # code locates torch_npu's files by it; this one names the emulator
    for name, fn in custom_ops.torch_npu_ops().items():
        setattr(mod, name, fn)
    # The submodules `import torch_npu` imports on a real host (contrib.transfer_to_npu is not one:
    # importing it patches torch).
    for sub in ("npu", "utils", "optim", "contrib"):
        importlib.import_module(f"torch_npu.{sub}")


def _build_optim(mod: types.ModuleType) -> None:
    mod.NpuFusedAdamW = NpuFusedAdamW  # type: ignore[attr-defined]
    mod.NpuFusedAdam = NpuFusedAdam  # type: ignore[attr-defined]


def _build_empty(mod: types.ModuleType) -> None:
    return None


def _build_transfer_to_npu(mod: types.ModuleType) -> None:
    """Importing it redirects cuda to npu for the rest of the process, as on a real host."""
    from sandbox.cuda_redirect import redirect

    redirect.install("npu")


MODULES: dict[str, tuple[Callable[[types.ModuleType], None], bool]] = {
    "torch_npu": (_build_root, True),
    "torch_npu.npu": (_build_npu, True),
    "torch_npu.npu.amp": (_build_amp, False),
    "torch_npu.npu.random": (_build_random, False),
    "torch_npu.npu.memory": (_build_memory, False),
    "torch_npu.utils": (_build_empty, True),
    "torch_npu.optim": (_build_optim, True),
    "torch_npu.contrib": (_build_empty, True),
    "torch_npu.contrib.transfer_to_npu": (_build_transfer_to_npu, False),
}


def install_modules(version: str) -> tuple[types.ModuleType, types.ModuleType]:
    """Make torch_npu importable (through the ordinary import machinery) and import it."""
    stale = sys.modules.get("torch_npu")
    if stale is not None and not getattr(stale, "_ascend_sim", False):
        for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
            del sys.modules[name]
    surface.install_finder(version, MODULES)
    tnpu = importlib.import_module("torch_npu")
    tnpu.__version__ = version  # type: ignore[attr-defined]  # a reconfigure may change it
    npu_mod = importlib.import_module("torch_npu.npu")
    sys.modules["torch.npu.amp"] = npu_mod.amp  # type: ignore[attr-defined]
    surface.forget_library_probes()
    return npu_mod, tnpu
