"""H23: what config.json says about the checkpoint: a ``quantization_config`` (GPTQ / AWQ / bitsandbytes /
FP8 ...) whose loader needs CUDA kernels, and a checkpoint dtype (``torch_dtype`` / ``dtype``) that some
Ascend chips have no kernels for (bfloat16 on the 310P, float8 on A2/A3).

A random-weight port (--shrink, the reference) builds the model from the config and never loads the
checkpoint, so these do not stop validation; they stop a deployment with the real weights.

One hazard class, one module: detector, the reason it is left to a person, its knowledge-base topic (see
docs/rules.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agents.models import Finding
from agents.rules.base import BLOCKS, HIGH, LOW, NUMBERS, HazardRule
from agents.rules.config_json import json_key_line
from agents.rules.context import TextFile

# quant_method -> what loading it needs (transformers' quantizers; vLLM-Ascend's quantization guide: W8A8,
# W4A8, W4A4 from msModelSlim are what Ascend serves).
QUANT_LOADERS: dict[str, str] = {
    "gptq": "auto-gptq / gptqmodel CUDA (exllama, marlin) kernels",
    "awq": "autoawq's CUDA GEMM kernels",
    "bitsandbytes": "bitsandbytes' CUDA 4/8-bit kernels",
    "fp8": "float8 matmuls (CUDA sm89+)",
    "fbgemm_fp8": "fbgemm-gpu's float8 kernels",
    "eetq": "EETQ's CUDA int8 kernels",
    "hqq": "HQQ's CUDA kernels",
    "aqlm": "AQLM's CUDA kernels",
    "exl2": "exllamav2's CUDA kernels",
    "marlin": "marlin CUDA kernels",
}
_DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float8_e4m3fn": "float8", "float8_e5m2": "float8", "float32": "float32", "float": "float32"}


_CAST = {"bfloat16": "to float16, whose narrower range can overflow where bfloat16 did not",
         "float8": "up to a 16-bit float: twice the weight memory"}


def _configs(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted prefix, config) for the config and each nested sub-config (text_config, vision_config...)."""
    yield prefix, config
    for k, v in config.items():
        if isinstance(v, dict) and k != "quantization_config":
            yield from _configs(v, f"{prefix}{k}.")


def _chips_without(dtype: str) -> list[str]:
    from sandbox.targets.registry import CHIPS

    return [f"{c.key} ({c.product})" for c in CHIPS.values() if dtype not in c.dtypes]


def _detect_text(tf: TextFile) -> list[Finding]:
    config = tf.config_object()
    if config is None:
        return []
    lines = tf.text.splitlines()
    out: list[Finding] = []

    def add(rule: str, key: str, message: str, category: Any, severity: Any) -> None:
        line = json_key_line(tf.text, key)
        snippet = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        out.append(tf.finding("H23", rule, line, 0, snippet, message, category, severity))

    for prefix, cfg in _configs(config):
        quant = cfg.get("quantization_config")
        if isinstance(quant, dict):
            method = str(quant.get("quant_method") or ("bitsandbytes" if quant.get("load_in_4bit") or
                                                       quant.get("load_in_8bit") else "unknown")).lower()
            bits = quant.get("bits") or ("4" if quant.get("load_in_4bit") else "8" if quant.get("load_in_8bit") else "")
            needs = QUANT_LOADERS.get(method, "a quantisation loader npuport does not know")
            add("quantization-config", f"{prefix}quantization_config",
                f"the checkpoint is {method}-quantised{f' ({bits}-bit)' if bits else ''}: loading it needs {needs}, "
                "which Ascend does not have; an NPU deployment needs the unquantised checkpoint or an "
                "Ascend quantisation (msModelSlim W8A8 / W4A8 for vLLM-Ascend). Random-weight validation "
                "(--shrink) builds the model from the config and is not affected", BLOCKS, HIGH)
        for key in ("torch_dtype", "dtype"):
            value = cfg.get(key)
            dtype = _DTYPES.get(str(value).removeprefix("torch.")) if isinstance(value, str) else None
            missing = _chips_without(dtype) if dtype else []
            if dtype and missing:
                add("checkpoint-dtype", f"{prefix}{key}",
                    f"the checkpoint is stored in {dtype}: {', '.join(missing)} has no {dtype} kernels, so there "
                    f"the weights are cast ({_CAST.get(dtype, 'to a dtype the chip computes')}), and the chip's "
                    "serving dtype decides the numerics", NUMBERS, LOW)
    return out


RULE = HazardRule(
    hazard="H23",
    title="Checkpoint quantisation and dtype in config.json",
    detect_text=_detect_text,
    manual={
        "quantization-config": "the weights themselves are quantised for CUDA kernels; re-quantising for Ascend "
                               "(msModelSlim) or using the float checkpoint is a choice of the person deploying",
        "checkpoint-dtype": "which dtype a chip serves is the deploy step's (the chip's serving dtype); the "
                            "checkpoint is data, not code",
    },
    report_only=True,
    kb_topic="recipe:H23",
    left_as_written="config.json describes the checkpoint; npuport validates with random weights built from it",
    fixtures=("tests/test_scan_classes.py",),
)
