"""H10: serving knobs (vLLM CUDA-only settings, CUDA graphs, fork vs spawn).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.models import Finding
from agents.rules.base import (
    BLOCKS,
    HIGH,
    LOW,
    MEDIUM,
    SLOWS,
    HazardRule,
)
from agents.rules.context import ModuleContext, TextFile
from agents.rules.cst_helpers import (
    last_name,
    positional,
    string_value,
)

CUDA_GRAPH_KNOBS = {"cuda_graph_sizes", "cudagraph_capture_sizes", "max_seq_len_to_capture",
                    "max_context_len_to_capture", "cuda_graph_batch_sizes"}
# vLLM engine arguments renamed since the releases CUDA code was written for -> what vllm-ascend's docs pass
RENAMED_ENGINE_ARGS = {"disable_mm_preprocessor_cache": "mm_processor_cache_gb=0 (--mm-processor-cache-gb 0)"}
ENV_KEYS = ("VLLM_ATTENTION_BACKEND", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_V1")
CUDA_ATTENTION_BACKENDS = {"FLASH_ATTN", "FLASH_ATTN_VLLM_V1", "XFORMERS", "FLASHINFER", "TRITON_ATTN",
                           "TRITON_ATTN_VLLM_V1", "FLASHMLA", "CUTLASS_MLA"}


# --- detector ----------------------------------------------------------------------------------

def _h10_serving(ctx: ModuleContext) -> None:
    for arg in ctx.ix.args:
        kw = arg.keyword.value if arg.keyword is not None else ""
        if kw == "enforce_eager" and isinstance(arg.value, cst.Name) and arg.value.value == "False":
            ctx.add("H10", "cuda-graph-mode", arg,
                    "enforce_eager=False asks vLLM to capture CUDA graphs; vllm-ascend has its own graph mode "
                    "with other capture sizes and limits: start eager, then enable its graph mode", BLOCKS, MEDIUM)
        elif kw in CUDA_GRAPH_KNOBS:
            ctx.add("H10", "cuda-graph-knob", arg,
                    f"`{kw}` tunes CUDA-graph capture; vllm-ascend's graph mode is configured differently",
                    SLOWS, LOW)
        elif kw in ENV_KEYS:
            _h10_env(ctx, arg, kw, arg.value)
        elif kw in RENAMED_ENGINE_ARGS:
            ctx.add("H10", "vllm-renamed-option", arg,
                    f"`{kw}` is an engine argument later vLLM releases renamed; the vLLM that vllm-ascend pairs "
                    f"with takes {RENAMED_ENGINE_ARGS[kw]}", BLOCKS, MEDIUM)
    for s in ctx.ix.strings:
        value = string_value(s)
        if value in ENV_KEYS:
            _h10_env(ctx, s, value or "", _env_value(ctx, s))
        elif value in CUDA_GRAPH_KNOBS and isinstance(ctx.parent(s), cst.DictElement):
            ctx.add("H10", "cuda-graph-knob", s,
                    f"`{value}` tunes CUDA-graph capture; vllm-ascend's graph mode is configured differently",
                    SLOWS, LOW)
    for call in ctx.ix.calls:
        if last_name(call.func) in ("set_start_method", "get_context"):
            first = positional(call, 0)
            if first is not None and string_value(first) == "fork":
                ctx.add("H10", "fork-start-method", call,
                        "multiprocessing by fork: a forked child cannot use an NPU runtime initialised in the "
                        "parent, and remote model code must re-import; use \"spawn\"", BLOCKS, MEDIUM)


def _h10_env(ctx: ModuleContext, node: cst.CSTNode, key: str, value_node: cst.CSTNode | None) -> None:
    value = string_value(value_node) if value_node is not None else None
    if key == "VLLM_ATTENTION_BACKEND" and value is not None and value in CUDA_ATTENTION_BACKENDS:
        ctx.add("H10", "vllm-attention-backend", node,
                f"VLLM_ATTENTION_BACKEND={value} forces a CUDA attention backend; vllm-ascend picks its own, "
                "so unset it", BLOCKS, HIGH)
    elif key == "VLLM_USE_V1" and value == "0":
        ctx.add("H10", "vllm-v0-engine", node,
                "VLLM_USE_V1=0 selects vLLM's V0 engine: recent vLLM has only V1, and vllm-ascend's tutorials "
                "serve with VLLM_USE_V1=1", BLOCKS, HIGH)
    elif key == "VLLM_WORKER_MULTIPROC_METHOD" and value == "fork":
        ctx.add("H10", "vllm-fork-workers", node,
                "vLLM workers by fork: a forked child cannot use an NPU runtime initialised in the parent, and "
                "remote model code must be importable; use spawn", BLOCKS, MEDIUM)


def _env_value(ctx: ModuleContext, key: cst.CSTNode) -> cst.CSTNode | None:
    """The value written for an env key: os.environ[K] = V, setdefault(K, V), putenv(K, V), {K: V}."""
    p = ctx.parent(key)
    if isinstance(p, cst.DictElement) and p.key is key:
        return p.value
    if isinstance(p, cst.Arg):
        call = ctx.parent(p)
        if isinstance(call, cst.Call) and last_name(call.func) in ("setdefault", "putenv") \
                and positional(call, 0) is key:
            return positional(call, 1)
        return None
    for a, _ in ctx.ancestors(key):
        if isinstance(a, cst.Subscript | cst.SubscriptElement | cst.Index):
            continue
        if isinstance(a, cst.AssignTarget):
            assign = ctx.parent(a)
            return assign.value if isinstance(assign, cst.Assign) else None
        return None
    return None


def _h10_text(tf: TextFile) -> list[Finding]:
    out: list[Finding] = []
    for ln in tf.env_lines():
        m = re.search(r"\bVLLM_ATTENTION_BACKEND\s*=\s*[\"']?(\w+)", ln.line)
        if m and m.group(1) in CUDA_ATTENTION_BACKENDS:
            out.append(tf.finding("H10", "vllm-attention-backend", ln.lineno, m.start(), ln.snippet,
                                  f"VLLM_ATTENTION_BACKEND={m.group(1)} forces a CUDA attention backend; "
                                  "vllm-ascend picks its own, so unset it", BLOCKS, HIGH))
        m = re.search(r"\bVLLM_USE_V1\s*=\s*[\"']?0\b", ln.line)
        if m:
            out.append(tf.finding("H10", "vllm-v0-engine", ln.lineno, m.start(), ln.snippet,
                                  "VLLM_USE_V1=0 selects vLLM's V0 engine: recent vLLM has only V1, and "
                                  "vllm-ascend's tutorials serve with VLLM_USE_V1=1", BLOCKS, HIGH))
        m = re.search(r"\bVLLM_WORKER_MULTIPROC_METHOD\s*=\s*[\"']?fork", ln.line)
        if m:
            out.append(tf.finding("H10", "vllm-fork-workers", ln.lineno, m.start(), ln.snippet,
                                  "vLLM workers by fork: a forked child cannot use an NPU runtime initialised in "
                                  "the parent, and remote model code must be importable; use spawn", BLOCKS,
                                  MEDIUM))
    return out


_SERVE = "serving settings are written by the deploy step (serve.sh / set_env.sh), not patched into the model"

RULE = HazardRule(
    hazard="H10",
    title="Serving knobs (vLLM CUDA-only settings, fork vs spawn)",
    detect=_h10_serving,
    detect_text=_h10_text,
    manual={"cuda-graph-mode": _SERVE, "cuda-graph-knob": _SERVE, "vllm-attention-backend": _SERVE,
            "vllm-fork-workers": _SERVE, "fork-start-method": _SERVE, "vllm-v0-engine": _SERVE,
            "vllm-renamed-option": _SERVE},
    kb_topic="recipe:H10",
    left_as_written="serving settings are written into serve.sh / set_env.sh",
    fixtures=("tests/test_scanner.py", "tests/test_deploy.py"),
)
