"""H8: framework coupling (private transformers/vLLM APIs, exact pins, CUDA wheels, remote code).

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
    NUMBERS,
    HazardRule,
)
from agents.rules.context import PIN_RE, ModuleContext, TextFile
from agents.rules.cst_helpers import (
    dotted,
    walk_nodes,
)
from sandbox.cuda_redirect.cuda_only import CUDA_ONLY_DISTS

FRAMEWORK_INTERNAL_MODULES = {
    "transformers.utils.import_utils", "transformers.modeling_flash_attention_utils",
    "transformers.integrations.flash_attention", "transformers.integrations.flash_paged",
}
FLASH_AVAILABILITY_NAMES = {"is_flash_attn_2_available", "is_flash_attn_available",
                            "is_flash_attn_greater_or_equal_2_10", "is_flash_attn_greater_or_equal",
                            "is_flash_attn_3_available"}
FRAMEWORK_PACKAGES = {"torch", "torchvision", "torchaudio", "transformers", "vllm", "accelerate", "tokenizers",
                      "numpy", "safetensors", "deepspeed", "peft"}
CUDA_WHEEL_RE = re.compile(r"\+cu\d+|/whl/cu\d+|cuda1\d[0-9x]*\b")


# transformers API a model's code may lean on that later releases changed: name -> (what changed, what to do).
# Private hooks are overridden by subclasses of transformers models; cache members are read by decode loops.
# Both couple the code to the release it was written for (config.json's transformers_version).
TRANSFORMERS_PRIVATE_HOOKS: dict[str, str] = {
    "_update_causal_mask": "transformers 4.53 moved mask building to masking_utils (create_causal_mask): its models "
                           "no longer call _update_causal_mask, so an override is silently skipped and the model runs "
                           "with the default causal mask",
    "_prepare_4d_causal_attention_mask_with_cache_position": "a private static helper of each model; removed with "
                                                             "the 4.53 mask refactor",
    "_prepare_decoder_attention_mask": "the pre-4.36 mask hook; later models never call it",
    "_reorder_cache": "beam search reorders Cache objects itself in later releases; the hook is no longer called",
    "_set_gradient_checkpointing": "its signature changed in 4.35 (gradient_checkpointing_func) and it is no longer "
                                   "the hook later releases call",
}
TRANSFORMERS_CACHE_API: dict[str, str] = {
    "seen_tokens": "deprecated since 4.39 (\"will be removed in v4.41\"); use get_seq_length() or cache_position",
    "get_max_length": "deprecated for get_max_cache_shape(); transformers' note says it raises from v4.48",
    "get_usable_length": "deprecated with the cache refactors (4.4x-4.5x) and gone from later releases; use "
                         "get_seq_length()",
    "from_legacy_cache": "the tuple (legacy) cache format is deprecated and removed in transformers 5",
    "to_legacy_cache": "the tuple (legacy) cache format is deprecated and removed in transformers 5",
}
_COUPLING = ("keep transformers at the release the model was written for (config.json transformers_version; the "
             "environment step pins it), or change this code with the release")


# --- detector ----------------------------------------------------------------------------------

def _h8_framework(ctx: ModuleContext) -> None:
    for imp in ctx.ix.imports:
        if not isinstance(imp, cst.ImportFrom) or imp.relative or imp.module is None:
            continue
        mod = dotted(imp.module) or ""
        if not mod.startswith(("transformers", "vllm")):
            continue
        names = [] if isinstance(imp.names, cst.ImportStar) else [dotted(a.name) or "" for a in imp.names]
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        flash = [n for n in names if n in FLASH_AVAILABILITY_NAMES]
        if private or any(p.startswith("_") for p in mod.split(".")):
            ctx.add("H8", "private-framework-import", imp,
                    f"imports private `{mod}` names ({', '.join(private) or mod}): they change between releases, "
                    "and the Ascend stack pins its own transformers/vLLM versions", BLOCKS, MEDIUM)
        elif mod in FRAMEWORK_INTERNAL_MODULES:
            ctx.add("H8", "framework-internals-import", imp,
                    f"imports internals of `{mod}`: not a stable API, and tied to CUDA flash-attn handling",
                    BLOCKS, MEDIUM)
        elif mod.startswith(("transformers.models.", "vllm.model_executor.")):
            ctx.add("H8", "framework-model-import", imp,
                    f"imports from `{mod}`: model internals move between releases; pin-compatible only with "
                    "the version it was written for", BLOCKS, LOW)
        if flash:
            ctx.add("H8", "flash-attn-availability-check", imp,
                    f"`{flash[0]}` checks for CUDA flash-attn: always False on Ascend, and renamed across "
                    "transformers releases", BLOCKS, LOW)
    for ref in ctx.refs:
        # a dotted use (`import_utils.is_flash_attn_2_available()`); names imported bare are reported above
        if isinstance(ref.node, cst.Attribute) and ref.node.attr.value in FLASH_AVAILABILITY_NAMES:
            ctx.add("H8", "flash-attn-availability-check", ref.node,
                    "checks for CUDA flash-attn: always False on Ascend, and renamed across transformers "
                    "releases", BLOCKS, LOW)
    _h8_transformers_api(ctx)
    for arg in ctx.ix.args:
        if arg.keyword is not None and arg.keyword.value == "trust_remote_code" \
                and isinstance(arg.value, cst.Name) and arg.value.value == "True":
            ctx.add("H8", "trust-remote-code", arg,
                    "trust_remote_code=True runs the model repo's own Python: it is tied to the transformers "
                    "version it was written for, and serving workers must be able to import it (spawn)",
                    BLOCKS, LOW)


def _uses_transformers(ctx: ModuleContext) -> bool:
    return any(v == "transformers" or v.startswith("transformers.") for v in ctx.aliases.values())


def _h8_transformers_api(ctx: ModuleContext) -> None:
    """Private transformers hooks a class overrides or calls, and Cache members later releases removed."""
    if not _uses_transformers(ctx):
        return
    for node in walk_nodes(ctx.module):
        if isinstance(node, cst.ClassDef) and node.bases:
            for st in node.body.body:
                if isinstance(st, cst.FunctionDef) and st.name.value in TRANSFORMERS_PRIVATE_HOOKS:
                    name = st.name.value
                    ctx.add("H8", "private-api-override", st.name,
                            f"`{node.name.value}` overrides transformers' private `{name}`: "
                            f"{TRANSFORMERS_PRIVATE_HOOKS[name]}; {_COUPLING}", NUMBERS, HIGH)
        elif isinstance(node, cst.Attribute) and node.attr.value in TRANSFORMERS_CACHE_API:
            name = node.attr.value
            parent = ctx.parent(node)
            if name == "seen_tokens" or isinstance(parent, cst.Call) and parent.func is node:
                ctx.add("H8", "deprecated-cache-api", node,
                        f"`{ctx.code(node).strip()}`: Cache.{name} {TRANSFORMERS_CACHE_API[name]}; {_COUPLING}",
                        BLOCKS, MEDIUM)
        elif isinstance(node, cst.Attribute) and node.attr.value in TRANSFORMERS_PRIVATE_HOOKS and \
                isinstance(ctx.parent(node), cst.Call):
            name = node.attr.value
            ctx.add("H8", "private-api-override", node,
                    f"calls transformers' private `{name}`: {TRANSFORMERS_PRIVATE_HOOKS[name]}; {_COUPLING}",
                    BLOCKS, MEDIUM)


def _h8_text(tf: TextFile) -> list[Finding]:
    out: list[Finding] = []
    for req in tf.requirement_lines():
        for m in PIN_RE.finditer(req.line):
            pkg, ver = m.group(1), m.group(3)
            norm = pkg.lower().replace("_", "-")
            if norm in CUDA_ONLY_DISTS:
                continue  # H3 reports it as a CUDA-only requirement
            sev = MEDIUM if norm in FRAMEWORK_PACKAGES else LOW
            out.append(tf.finding("H8", "exact-pin", req.lineno, m.start(), req.snippet,
                                  f"exact pin `{pkg}=={ver}`: torch_npu and vllm-ascend pair with specific torch/"
                                  "transformers releases, so an exact pin may not install beside them; loosen it "
                                  "or check the compatibility table", BLOCKS, sev))
        cw = CUDA_WHEEL_RE.search(req.line)
        if cw:
            out.append(tf.finding("H8", "cuda-wheel", req.lineno, cw.start(), req.snippet,
                                  "pulls a CUDA build of torch (cuXXX wheel or index); Ascend needs the CPU "
                                  "build of torch plus torch_npu", BLOCKS, MEDIUM))
    return out


_LAYERED = "the environment step resolves a layered environment with its own pins"

RULE = HazardRule(
    hazard="H8",
    title="Framework coupling (private APIs, exact pins, remote code)",
    detect=_h8_framework,
    detect_text=_h8_text,
    manual={
        "private-framework-import": "private framework APIs need the model's code to change with the release",
        "framework-internals-import": "framework internals need the model's code to change with the release",
        "framework-model-import": "model internals are tied to the framework version",
        "flash-attn-availability-check": "the check is False on Ascend; the model takes its other branch",
        "trust-remote-code": "remote code is the model's own; serving runs it with spawn",
        "private-api-override": "the override is the model's design; it works only with the transformers release it "
                                "was written for, which the environment pins",
        "deprecated-cache-api": "the cache calls work with the transformers release the model was written for, which "
                                "the environment pins; newer releases need the code changed",
        "exact-pin": _LAYERED,
        "cuda-wheel": _LAYERED,
    },
    kb_topic="recipe:H8",
    left_as_written="the model runs in a layered environment with its own pins",
    fixtures=("tests/test_scanner.py",),
)
