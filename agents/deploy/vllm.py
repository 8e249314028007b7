"""vllm-ascend serving settings from the model's facts, what we know of vllm-ascend, and tuned values;
rendered as serve.sh and set_env.sh. Every setting carries its reason (our words) and a citation
(a file of the vllm-ascend docs folder the user has, or one of our recipes), and says whether it was
measured on a real NPU (only agents/deploy/vllm_loop.py measures; otherwise "not measured on this host").
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import BaseModel

from agents.tuning.space import DEVICE_MEMORY_GIB, ModelFacts
from sandbox.targets import CHIP_REGISTRY

DOCS = "vllm-ascend-docs"
NOT_MEASURED = "not measured on this host"


class ServeSetting(BaseModel):
    name: str  # CLI flag name without dashes, additional_config key, or environment variable
    value: Any
    kind: str  # "flag" | "additional_config" | "env"
    reason: str
    citation: str
    measured: str = NOT_MEASURED


def _size(gib: float) -> str:
    return f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB" if gib * 1024 >= 0.1 else f"{gib * 2**20:.0f} KiB"


def _pow2_at_most(n: int, cap: int) -> int:
    v = 1
    while v * 2 <= min(n, cap):
        v *= 2
    return v


def plan_serve(facts: ModelFacts, *, chip: str = "910b", n_devices: int = 1, tuned: dict[str, Any] | None = None,
               measured: str | None = None) -> list[ServeSetting]:
    """The settings, in serve.sh order. ``tuned`` (from the real-NPU loop) overrides the derived values."""
    tuned = tuned or {}
    hbm = DEVICE_MEMORY_GIB.get(chip, 32.0)
    weights_gib = facts.param_estimate() * 2 / 2**30
    tp = 1
    while weights_gib / tp > 0.6 * hbm and tp * 2 <= max(n_devices, 1):
        tp *= 2  # split until the weights leave room for the KV cache
    while facts.num_heads and facts.num_heads % tp:
        tp //= 2
    max_len = int(tuned.get("max_model_len") or min(facts.max_position or 4096, 32768))
    seqs = int(tuned.get("max_num_seqs") or (256 if weights_gib < 0.5 * hbm else 64))
    batched = int(tuned.get("max_num_batched_tokens") or max(max_len, 8192))
    util = float(tuned.get("gpu_memory_utilization") or 0.9)
    eager = bool(tuned.get("enforce_eager", False))
    capture = _pow2_at_most(seqs, 512)
    spec = CHIP_REGISTRY.get(chip)
    dtype = spec.serve_dtype if spec else "bfloat16"
    how = measured or NOT_MEASURED
    s = [
        ServeSetting(name="tensor-parallel-size", value=tp, kind="flag", citation=f"{DOCS}/supported_models.md",
                     reason=f"bf16 weights are about {_size(weights_gib)} against {hbm:g} GiB of HBM per {chip} device; "
                            "split across devices only when they crowd out the KV cache, and only by a divisor of "
                            f"the {facts.num_heads or '?'} attention heads", measured=how),
        ServeSetting(name="max-model-len", value=max_len, kind="flag", citation=f"{DOCS}/supported_models.md",
                     reason=f"the model's max_position_embeddings is {facts.max_position or 'unknown'}; longer contexts "
                            "would run past what it was trained for, and a shorter cap frees KV-cache blocks",
                     measured=how),
        ServeSetting(name="max-num-seqs", value=seqs, kind="flag", citation=f"{DOCS}/optimization_and_tuning.md",
                     reason="how many requests decode together: throughput grows with it until HBM or the scheduler "
                            "saturates; a small model can keep many in flight", measured=how),
        ServeSetting(name="max-num-batched-tokens", value=batched, kind="flag",
                     citation=f"{DOCS}/optimization_and_tuning.md",
                     reason=f"tokens per scheduler step; kept >= max-model-len ({max_len}) so that a full-length prompt "
                            "can be scheduled even with chunked prefill off", measured=how),
        ServeSetting(name="gpu-memory-utilization", value=util, kind="flag", citation=f"{DOCS}/optimization_and_tuning.md",
                     reason="share of HBM vLLM may take for weights, activations and KV cache; 0.9 leaves room for the "
                            "ACL graph capture workspace", measured=how),
        ServeSetting(name="dtype", value=dtype, kind="flag", citation="recipe:H5",
                     reason=spec.serve_note if spec and spec.serve_note
                     else f"the checkpoint dtype is {facts.dtype}; bfloat16 is the native half type on {chip}",
                     measured=how),
    ]
    if facts.remote_code:
        s.append(ServeSetting(name="trust-remote-code", value=True, kind="flag", citation="recipe:H10",
                              reason="the model's classes live in its own folder (auto_map / custom modeling code)",
                              measured=how))
    if eager:
        s.append(ServeSetting(name="enforce-eager", value=True, kind="flag", citation=f"{DOCS}/graph_mode.md",
                              reason="graph capture was measured slower or failed for this model; eager mode is the "
                                     "documented fallback", measured=how))
    else:
        mode = "FULL_DECODE_ONLY" if facts.moe else "FULL_AND_PIECEWISE"
        s.append(ServeSetting(
            name="compilation-config", value={"cudagraph_mode": mode, "max_cudagraph_capture_size": capture}, kind="flag",
            citation=f"{DOCS}/graph_mode.md; {DOCS}/ACL_Graph.md",
            reason=("graph mode (ACL graph capture and replay) removes per-op launch overhead in decode; "
                    + ("a MoE model's decode batches are uniform, so full decode-only graphs capture fewer pieces "
                       if facts.moe else "the default mixed mode keeps piecewise graphs for prefill ")
                    + f"and the capture sizes stop at max-num-seqs ({capture}), the lever the docs give when capture "
                      "runs out of stream resources"), measured=how))
    extra: dict[str, Any] = {}
    if facts.moe:
        extra["multistream_overlap_shared_expert"] = True
        s.append(ServeSetting(name="multistream_overlap_shared_expert", value=True, kind="additional_config",
                              citation=f"{DOCS}/additional_config.md",
                              reason="the model is MoE with shared experts: run the shared expert on a second stream, "
                                     "overlapping the routed experts", measured=how))
    s += [
        ServeSetting(name="PYTORCH_NPU_ALLOC_CONF", value="expandable_segments:True", kind="env",
                     citation=f"{DOCS}/optimization_and_tuning.md",
                     reason="lets the caching allocator grow segments instead of splitting blocks, which cuts "
                            "fragmentation when batch shapes vary", measured=how),
        ServeSetting(name="TASK_QUEUE_ENABLE", value="2", kind="env", citation=f"{DOCS}/optimization_and_tuning.md",
                     reason="deeper operator dispatch queue: hides host-side launch cost (raises peak memory a little)",
                     measured=how),
        ServeSetting(name="CPU_AFFINITY_CONF", value="1", kind="env", citation=f"{DOCS}/optimization_and_tuning.md",
                     reason="binds the host threads that feed each NPU to nearby cores, which helps host-bound models",
                     measured=how),
    ]
    if facts.remote_code:
        s.append(ServeSetting(name="VLLM_WORKER_MULTIPROC_METHOD", value="spawn", kind="env", citation="recipe:H10",
                              reason="remote-code models must not be forked after the NPU runtime is initialised: "
                                     "workers are started with spawn", measured=how))
    if tp > 1:
        s.append(ServeSetting(name="HCCL_OP_EXPANSION_MODE", value="AIV", kind="env",
                              citation=f"{DOCS}/optimization_and_tuning.md",
                              reason="tensor parallel traffic: let the AI vector cores schedule HCCL communication",
                              measured=how))
    return s


def _flag(setting: ServeSetting) -> str:
    if setting.value is True:
        return f"--{setting.name}"
    value = json.dumps(setting.value) if isinstance(setting.value, dict) else str(setting.value)
    return f"--{setting.name} {shlex.quote(value)}"


def render_serve_sh(settings: list[ServeSetting], served_name: str) -> str:
    flags = [x for x in settings if x.kind == "flag"]
    extra = {x.name: x.value for x in settings if x.kind == "additional_config"}
    lines = [
        "#!/usr/bin/env bash",
        f"# Serve {served_name} with vLLM on Ascend (vllm-ascend). Generated by npuport.",
        f"# Every value below is derived, {NOT_MEASURED}, unless its comment says it was measured.",
        "# Usage: ./serve.sh [MODEL_DIR] (default: ./patched, the ported model)",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'source "$HERE/set_env.sh"',
        'MODEL="${1:-$HERE/patched}"',
        "",
    ]
    for x in flags:
        lines.append(f"# --{x.name}: {x.reason} [{x.citation}; {x.measured}]")
    for k, v in extra.items():
        x = next(s for s in settings if s.name == k)
        lines.append(f"# additional_config.{k}={json.dumps(v)}: {x.reason} [{x.citation}; {x.measured}]")
    cmd = ['exec vllm serve "$MODEL"', f"--served-model-name {shlex.quote(served_name)}"]
    cmd += [_flag(x) for x in flags]
    if extra:
        cmd.append(f"--additional-config {shlex.quote(json.dumps(extra))}")
    lines.append(" \\\n  ".join(cmd))
    return "\n".join(lines) + "\n"


def render_set_env_sh(settings: list[ServeSetting]) -> str:
    lines = [
        "#!/usr/bin/env bash",
        "# Environment for serving on Ascend with vllm-ascend. Generated by npuport; source it.",
        f"# Values are derived, {NOT_MEASURED}, unless a comment says otherwise.",
        "# The CANN toolkit must be set up first (its set_env.sh), if it is installed in the usual place:",
        "if [ -f /usr/local/Ascend/ascend-toolkit/set_env.sh ]; then",
        "  source /usr/local/Ascend/ascend-toolkit/set_env.sh",
        "fi",
    ]
    for x in settings:
        if x.kind == "env":
            lines.append(f"# {x.name}: {x.reason} [{x.citation}; {x.measured}]")
            lines.append(f"export {x.name}={shlex.quote(str(x.value))}")
    return "\n".join(lines) + "\n"
