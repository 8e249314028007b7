"""H8: framework coupling (private transformers/vLLM APIs, exact pins, CUDA wheels, remote code).

One hazard class, one module: detector, fix (codemod or the reason it is manual), the run-time
errors it explains and its knowledge-base topic (see docs/rules.md)."""

from __future__ import annotations

import re

import libcst as cst

from agents.cuda_only import CUDA_ONLY_DISTS
from agents.models import Finding
from agents.rules.base import (
    BLOCKS,
    LOW,
    MEDIUM,
    HazardRule,
)
from agents.rules.context import PIN_RE, ModuleContext, TextFile
from agents.rules.cst_helpers import (
    dotted,
)

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
    for arg in ctx.ix.args:
        if arg.keyword is not None and arg.keyword.value == "trust_remote_code" \
                and isinstance(arg.value, cst.Name) and arg.value.value == "True":
            ctx.add("H8", "trust-remote-code", arg,
                    "trust_remote_code=True runs the model repo's own Python: it is tied to the transformers "
                    "version it was written for, and serving workers must be able to import it (spawn)",
                    BLOCKS, LOW)


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
        "exact-pin": _LAYERED,
        "cuda-wheel": _LAYERED,
    },
    kb_topic="recipe:H8",
    recipe="knowledge/recipes/H8.md",
    left_as_written="the model runs in a layered environment with its own pins",
    fixtures=("tests/test_scanner.py",),
)
