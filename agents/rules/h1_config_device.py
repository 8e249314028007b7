"""H1 in config.json: a CUDA device named as a config value (``"device": "cuda"``).

The model's code reads it (``self.llm.to_empty(device=config.device)``, ``torch.tensor(ids).to(config.device)``),
so rewriting the code's "cuda" literals changes nothing: config.json passes "cuda" explicitly, and on Ascend the
first use fails with "Torch not compiled with CUDA enabled" (the debugger's cuda-assert, whose fix then found
nothing to change). The value is data, so the fix is in config.json: the port's device type (the target's
device: "npu" on Ascend), one edit per key, visible in port.patch. The reference keeps the original's value
(the cuda -> cpu redirect takes it). Part of hazard H1 (agents/rules/h1_cuda_device.py owns the rule)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from agents.models import Finding
from agents.rules.base import BLOCKS, HIGH
from agents.rules.config_json import rewrite_values, value_findings
from agents.rules.context import TextFile
from agents.rules.kit import CodemodResult
from sandbox.targets import Target

RULE_ID = "cuda-device-in-config"
_CUDA = re.compile(r"^cuda(:\d+)?$")


def cuda_values(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string value that names a CUDA device, at any nesting level."""
    for key, value in config.items():
        if isinstance(value, Mapping):
            yield from cuda_values(value, f"{prefix}{key}.")
        elif isinstance(value, str) and _CUDA.match(value):
            yield f"{prefix}{key}", value


def detect(tf: TextFile) -> list[Finding]:
    return value_findings(tf, cuda_values, "H1", RULE_ID, lambda key, value: (
        f"config.json names the CUDA device (`{key}`: \"{value}\") and the model's code reads it: on Ascend the "
        "first tensor or module moved there fails (no CUDA), whatever the code's own device literals say; the "
        "port's device type goes in its place"), BLOCKS, HIGH)


def config_device(source: str, *, file: str = "", target: Target | None = None,
                  **_: Any) -> CodemodResult:
    """Each CUDA device value of a config.json -> the target's device type, in place (the rest of the text
    as written)."""
    device = target.device.split(":")[0] if target is not None else ""
    if not device:
        return CodemodResult(source, False, skipped=["line 1: no target device to write"])
    return rewrite_values(source, cuda_values, device, "the port's device; the model's code reads this value")
