"""Fidelity audit: every torch_npu name transformers, accelerate and vllm-ascend reference is either
provided by ascend-sim or refused with the error a real host gives (sandbox/ascend_sim/audit.py).

transformers and accelerate are read from their installed sources at test time. vllm-ascend cannot be
installed here: its references come from NPUPORT_VLLM_ASCEND_SRC (a source tree) when set, else from
the committed list tests/fixtures/vllm_ascend_torch_npu_refs.txt (names only, how it was made is in
its header).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.ascend_sim import audit

REPO = Path(__file__).resolve().parents[1]
VLLM_LIST = REPO / "tests" / "fixtures" / "vllm_ascend_torch_npu_refs.txt"

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def test_audit_finds_every_reference_provided_or_refused_with_the_real_error() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox.ascend_sim.audit", "--vllm-ascend-list", str(VLLM_LIST)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    print(proc.stdout)
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"referenced (\d+), provided (\d+), refused with the real error (\d+), missing (\d+)", last)
    assert m, proc.stdout + proc.stderr
    n, provided, refused, missing = map(int, m.groups())
    assert missing == 0 and proc.returncode == 0, proc.stdout
    assert n == provided + refused
    sources = dict(re.findall(r"(transformers|accelerate|vllm-ascend) (\d+)", proc.stdout.splitlines()[-2]))
    assert set(sources) == {"transformers", "accelerate", "vllm-ascend"}
    assert int(sources["transformers"]) >= 5 and int(sources["vllm-ascend"]) >= 100
    # what transformers' NPU paths use is provided, not refused
    for ref in ("torch_npu.npu_fusion_attention", "torch_npu.optim.NpuFusedAdamW", "torch.npu.is_available"):
        assert f" {ref}:" not in proc.stdout, ref


def test_reference_parser_reads_imports_aliases_and_device_module_chains() -> None:
    src = (
        "import torch, torch_npu\n"
        "import torch_npu.contrib.transfer_to_npu\n"
        "from torch_npu import npu_rms_norm as rms\n"
        "from torch_npu.npu import amp\n"
        "x = torch_npu.npu_rotary_mul(a, b, c)\n"
        "torch.npu.synchronize()\n"
        "torch.ops.npu.npu_swiglu.default(x)\n"
        "getattr(torch, device_type).empty_cache()\n"
        "y = other.npu_fake\n"
    )
    refs = audit.references_in_source(src)
    assert refs == {
        "torch_npu",
        "torch_npu.contrib.transfer_to_npu",
        "torch_npu.npu_rms_norm",
        "torch_npu.npu",
        "torch_npu.npu.amp",
        "torch_npu.npu_rotary_mul",
        "torch.npu",
        "torch.npu.synchronize",
        "torch.ops.npu",
        "torch.ops.npu.npu_swiglu",
        "torch.npu.empty_cache",
    }


def test_a_new_unknown_reference_counts_as_missing() -> None:
    # An API a library starts using is not silently accepted: no refusal covers it.
    assert audit.refusal("torch_npu.npu_some_new_fused_op") is None
    assert audit.refusal("torch.npu.some_new_runtime_call") is None
    assert audit.refusal("torch_npu.npu_grouped_matmul") is not None
