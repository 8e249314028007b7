"""Typed search spaces per target, and the facts their constraints read.

A space is a list of dimensions (each with its values, whether the values are ordered, and a prior:
the value domain knowledge starts from). A point is a dict name -> value; it is validated into the
typed configuration of its target (``TorchRunConfig``, ``VllmAscendConfig``, ``FusedOpLayout``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from sandbox.targets import CHIP_REGISTRY, DEFAULT_CHIP, TARGETS, TargetSpec


class Dim(BaseModel):
    name: str
    values: list[Any]
    ordered: bool = False  # numeric dimension: neighbours along it are meaningful
    prior: Any = None  # where the search starts on this dimension (None: the first value)

    def start(self) -> Any:
        return self.prior if self.prior in self.values else self.values[0]


class SearchSpace(BaseModel):
    name: str
    target: str  # cpu | ascend-sim | npu | vllm-ascend | vllm-cpu
    kind: Literal["torch", "vllm-ascend", "fused-ops", "vllm-engine"] = "torch"
    dims: list[Dim]
    fixed: dict[str, Any] = Field(default_factory=dict)  # settings every point shares

    def size(self) -> int:
        n = 1
        for d in self.dims:
            n *= len(d.values)
        return n

    def points(self) -> Iterator[dict[str, Any]]:
        names = [d.name for d in self.dims]
        for combo in itertools.product(*(d.values for d in self.dims)):
            yield {**self.fixed, **dict(zip(names, combo, strict=True))}

    def key(self, point: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(point.get(d.name) for d in self.dims)

    def dim(self, name: str) -> Dim:
        return next(d for d in self.dims if d.name == name)


# ---------------------------------------------------------------------------------------------
# Typed configurations
# ---------------------------------------------------------------------------------------------


class TorchRunConfig(BaseModel):
    """How the harness runs the port on cpu / ascend-sim / npu (sandbox/bench/throughput.py applies it)."""

    batch: int = Field(default=1, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn: Literal["eager", "sdpa", "flash_attention_2"] | None = None
    compile: Literal["none", "default", "reduce-overhead"] = "none"
    threads: int | None = Field(default=None, ge=1)


class VllmAscendConfig(BaseModel):
    """vllm serve settings on vllm-ascend (serve.sh writes them)."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    max_model_len: int = Field(ge=16)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=16)
    gpu_memory_utilization: float = Field(gt=0.0, le=0.98)
    block_size: int = Field(default=128, ge=16)
    enforce_eager: bool = False
    cudagraph_mode: Literal["NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"] = "FULL_AND_PIECEWISE"
    max_cudagraph_capture_size: int | None = None
    enable_chunked_prefill: bool = True
    dtype: Literal["bfloat16", "float16", "auto"] = "auto"
    additional_config: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class FusedOpLayout(BaseModel):
    """Which torch_npu fused operator (and tensor layout) a patched attention / norm / rotary uses."""

    attention_op: Literal["sdpa", "npu_fusion_attention", "npu_prompt_flash_attention"] = "sdpa"
    input_layout: Literal["BSND", "BNSD", "BSH", "TND"] = "BNSD"
    rms_norm: Literal["eager", "npu_rms_norm"] = "eager"
    rotary: Literal["eager", "npu_rotary_mul"] = "eager"


CONFIG_MODELS: dict[str, type[BaseModel]] = {"torch": TorchRunConfig, "vllm-ascend": VllmAscendConfig,
                                             "fused-ops": FusedOpLayout}


def typed(space: SearchSpace, point: dict[str, Any]) -> BaseModel:
    """The point as its target's typed configuration (raises pydantic.ValidationError if ill-typed)."""
    return CONFIG_MODELS[space.kind](**point)  # the engine's kind is registered by agents/tuning/engine.py


# ---------------------------------------------------------------------------------------------
# Facts the constraints read
# ---------------------------------------------------------------------------------------------

# HBM per device in GiB, from the chip registry (sandbox/targets/chips.py).
DEVICE_MEMORY_GIB = {key: chip.memory_gib for key, chip in CHIP_REGISTRY.items()}


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


@dataclass
class ModelFacts:
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    vocab_size: int = 0
    max_position: int = 0
    intermediate_size: int = 0
    dtype: str = "float32"
    moe: bool = False
    num_experts: int = 0
    remote_code: bool = False
    supports_kv_cache: bool = False
    attn_impls: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    prompt_tokens: int = 64  # a typical request's prompt (the sample's)
    new_tokens: int = 8

    def param_estimate(self) -> int:
        """Rough parameter count from the config (embeddings + attention + MLP/experts per layer)."""
        d, layers = self.hidden_size, self.num_layers
        mlp = 3 * d * max(self.intermediate_size, 1) * max(1, self.num_experts if self.moe else 1)
        return 2 * self.vocab_size * d + layers * (4 * d * d + mlp)


@dataclass
class HostFacts:
    target: str  # a target of sandbox/targets, or a serving engine's space (vllm-ascend)
    chip: str = DEFAULT_CHIP
    cores: int = field(default_factory=usable_cores)
    memory_bytes: int = field(default_factory=host_memory_bytes)
    n_devices: int = 1
    model: ModelFacts = field(default_factory=ModelFacts)

    @property
    def spec(self) -> TargetSpec | None:
        """The target's capabilities; None for a serving engine's space, which is not a target."""
        return TARGETS.get(self.target)

    @property
    def on_device(self) -> bool:
        """The run computes on an Ascend device (or its emulation): chip memory and dtypes apply. A
        serving engine's space (vllm-ascend) serves on the NPU."""
        return self.spec.npu_like if self.spec is not None else True

    @property
    def device_memory_bytes(self) -> int:
        if not self.on_device:
            return self.memory_bytes
        return int(DEVICE_MEMORY_GIB.get(self.chip, 32.0) * 2**30)


_MOE_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")


def _size(value: Any) -> int:
    """A size, or the first of a per-layer list of sizes (``moe_intermediate_size: [3072, 3072, ...]``)."""
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, int | float) and not isinstance(v, bool)), 0)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def model_facts(config: dict[str, Any], has_custom_code: bool = False) -> ModelFacts:
    """Facts from a model's config.json (text_config / language_config nested dicts are merged in)."""
    flat = dict(config)
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(config.get(key), dict):
            flat = {**config[key], **{k: v for k, v in config.items() if not isinstance(v, dict)}}
    experts = next((int(flat[k]) for k in _MOE_KEYS if isinstance(flat.get(k), int) and flat[k] > 0), 0)
    impl = flat.get("_attn_implementation")
    return ModelFacts(
        hidden_size=int(flat.get("hidden_size") or flat.get("d_model") or 0),
        num_layers=int(flat.get("num_hidden_layers") or flat.get("n_layer") or 0),
        num_heads=int(flat.get("num_attention_heads") or flat.get("n_head") or 0),
        vocab_size=int(flat.get("vocab_size") or 0),
        max_position=int(flat.get("max_position_embeddings") or flat.get("max_seq_len") or 0),
        intermediate_size=_size(flat.get("moe_intermediate_size") or flat.get("intermediate_size")),
        dtype=str(flat.get("torch_dtype") or flat.get("dtype") or "float32"),
        moe=experts > 0,
        num_experts=experts,
        remote_code=bool(config.get("auto_map")) or has_custom_code,
        supports_kv_cache="use_cache" in flat,
        # A config that names an implementation switch accepts the standard three (the model may reject
        # one at run time; the benchmark then reports it).
        attn_impls=("eager", "sdpa", "flash_attention_2") if impl else (),
        architectures=tuple(config.get("architectures") or ()),
    )


# ---------------------------------------------------------------------------------------------
# The spaces
# ---------------------------------------------------------------------------------------------


def torch_space(facts: HostFacts, *, batches: list[int] | None = None, compile_modes: list[str] | None = None,
                name: str | None = None) -> SearchSpace:
    """cpu / ascend-sim / npu: batch size, dtype, attention implementation, torch.compile, threads.

    Only knobs the benchmark applies to the executed run are dimensions (sandbox/bench/throughput.py records what
    each changed). There is no KV-cache knob: the model's own generate decides whether it caches, and a
    config flag it does not read changed nothing in the measured run."""
    batches = batches or [1, 2, 4, 8, 16, 32]
    dims = [
        Dim(name="batch", values=batches, ordered=True, prior=max(batches)),
        Dim(name="threads", values=sorted({1, *range(2, facts.cores + 1, 2), facts.cores}), ordered=True,
            prior=facts.cores),
        Dim(name="dtype", values=["float32", "bfloat16", "float16"], prior="float32"),
        Dim(name="attn", values=list(facts.model.attn_impls) or [None],
            prior="sdpa" if facts.model.attn_impls else None),
        Dim(name="compile", values=compile_modes or ["none", "default", "reduce-overhead"], prior="none"),
    ]
    if facts.on_device:
        dims = [d for d in dims if d.name != "threads"]  # host threads do not drive device kernels
    return SearchSpace(name=name or f"{facts.target}-torch", target=facts.target, kind="torch", dims=dims)


def vllm_space(facts: HostFacts, max_model_len: int) -> SearchSpace:
    """vllm-ascend serving knobs (tuned only on a real NPU; see agents/deploy/vllm_loop.py)."""
    return SearchSpace(
        name="vllm-ascend-serve", target="vllm-ascend", kind="vllm-ascend",
        fixed={"max_model_len": max_model_len, "tensor_parallel_size": 1},
        dims=[
            Dim(name="max_num_seqs", values=[8, 16, 32, 64, 128, 256], ordered=True, prior=64),
            Dim(name="max_num_batched_tokens", values=[1024, 2048, 4096, 8192, 16384], ordered=True, prior=8192),
            Dim(name="gpu_memory_utilization", values=[0.8, 0.85, 0.9, 0.95], ordered=True, prior=0.9),
            Dim(name="block_size", values=[64, 128], prior=128),
            Dim(name="enforce_eager", values=[False, True], prior=False),
            Dim(name="cudagraph_mode", values=["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "NONE"],
                prior="FULL_AND_PIECEWISE"),
            Dim(name="enable_chunked_prefill", values=[True, False], prior=True),
        ],
    )


def fused_ops_space(facts: HostFacts) -> SearchSpace:
    return SearchSpace(
        name=f"{facts.target}-fused-ops", target=facts.target, kind="fused-ops",
        dims=[
            Dim(name="attention_op", values=["npu_fusion_attention", "npu_prompt_flash_attention", "sdpa"],
                prior="npu_fusion_attention"),
            Dim(name="input_layout", values=["BNSD", "BSND", "BSH", "TND"], prior="BNSD"),
            Dim(name="rms_norm", values=["npu_rms_norm", "eager"], prior="npu_rms_norm"),
            Dim(name="rotary", values=["npu_rotary_mul", "eager"], prior="npu_rotary_mul"),
        ],
    )


def space_from_dims(name: str, target: str, dims: dict[str, list[Any]], facts: HostFacts,
                    fixed: dict[str, Any] | None = None) -> SearchSpace:
    """A torch space restricted to the given values (recorded landscapes use this), keeping the
    full space's order and priors."""
    full = {d.name: d for d in torch_space(facts, batches=[v for v in dims.get("batch", [1])]).dims}
    out = []
    for dim_name, values in dims.items():
        base = full.get(dim_name)
        ordered = base.ordered if base else all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        prior = base.prior if base and base.prior in values else (max(values) if ordered else values[0])
        out.append(Dim(name=dim_name, values=list(values), ordered=ordered, prior=prior))
    order = [d.name for d in torch_space(facts).dims]
    out.sort(key=lambda d: order.index(d.name) if d.name in order else len(order))
    return SearchSpace(name=name, target=target, kind="torch", dims=out, fixed=dict(fixed or {}))
