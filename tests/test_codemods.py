"""Codemods on small snippets: each rewrite, its negative case, and that output still parses."""

from __future__ import annotations

import ast

from agents.fixing import codemods as cm
from agents.rules.h11_latent import SAME_DEVICE_HELPER
from agents.rules.kit import CodemodResult


def _apply(name: str, src: str, **params: object) -> CodemodResult:
    result = cm.CODEMODS[name][0](src, **params)
    ast.parse(result.source)
    return result


def test_device_agnostic_rewrites_every_cuda_form() -> None:
    src = (
        "import torch\n"
        "def f(x, m):\n"
        "    x = x.cuda(non_blocking=True)\n"
        "    m.cuda()\n"
        "    z = torch.zeros(2, device='cuda')\n"
        "    d = torch.device('cuda:0')\n"
        "    y = x.to('cuda')\n"
        "    if x.device.type == 'cuda':\n"
        "        torch.cuda.synchronize()\n"
        "    return torch.cuda.is_available()\n"
    )
    out = _apply("device-agnostic", src).source
    body = out.split("def f(")[1]
    assert "cuda" not in body.replace("_npuport", "")
    assert "x.to(_npuport_device(), non_blocking=True)" in body
    assert "torch.zeros(2, device=_npuport_device())" in body
    assert "d = _npuport_device()" in body
    assert "x.device.type == _npuport_device().type" in body
    assert "_npuport_backend().synchronize()" in body
    assert "return _npuport_backend().is_available()" in body
    assert out.count("def _npuport_device(") == 1


def test_device_agnostic_leaves_cuda_free_code_alone() -> None:
    src = "import torch\nx = torch.zeros(2, device='cpu')\nname = 'cudatoolkit'\n"
    result = _apply("device-agnostic", src)
    assert not result.changed
    assert result.source == src


def test_helpers_are_inserted_once_across_codemods_and_torch_is_imported() -> None:
    src = "def f(x):\n    with torch.cuda.amp.autocast():\n        return x.cuda()\n"
    out = _apply("cuda-autocast", src).source
    out = _apply("device-agnostic", out).source
    assert out.count("def _npuport_device(") == 1
    assert "import torch\n" in out
    assert "torch.autocast(_npuport_device().type, dtype=torch.float16)" in out


def test_guard_cuda_only_imports_removes_unused_and_guards_used() -> None:
    src = (
        "import torch\n"
        "from flash_attn import flash_attn_func\n"
        "import xformers.ops as xops\n"
        "def f(q):\n"
        "    return xops.memory_efficient_attention(q, q, q)\n"
    )
    result = _apply("guard-cuda-only-imports", src)
    assert "flash_attn" not in result.source
    assert "try:\n    import xformers.ops as xops\nexcept ImportError:" in result.source
    assert "xops = _NpuportMissing('xformers.ops')" in result.source
    assert len(result.edits) == 2


def test_guard_cuda_only_imports_keeps_already_guarded_and_unrelated_imports() -> None:
    src = "import numpy as np\ntry:\n    import triton\nexcept ImportError:\n    triton = None\n"
    assert not _apply("guard-cuda-only-imports", src).changed


def test_float64_to_float32() -> None:
    src = "import torch\nt = torch.arange(3, dtype=torch.float64).double()\nu = torch.zeros(2, dtype=torch.double)\n"
    out = _apply("float64-to-float32", src).source
    assert "float64" not in out and "double" not in out
    assert out.count("torch.float32") == 2 and ".float()" in out
    assert not _apply("float64-to-float32", "import torch\nt = torch.zeros(2)\n").changed


def test_align_devices_only_touches_the_named_line() -> None:
    src = "import torch\na = torch.cat([x, y], dim=0)\nb = torch.cat([x, y], dim=0)\n"
    result = _apply("align-devices", src, line=3)
    assert "a = torch.cat([x, y], dim=0)" in result.source
    assert "b = torch.cat(_npuport_same_device([x, y]), dim=0)" in result.source
    assert "def _npuport_same_device(" in result.source


def test_same_device_helper_moves_cpu_tensors_to_the_other_device() -> None:
    import torch

    ns: dict[str, object] = {}
    exec(SAME_DEVICE_HELPER, ns)
    helper = ns["_npuport_same_device"]
    a, b = torch.zeros(2), torch.ones(2)
    moved = helper([a, b])  # type: ignore[operator]
    assert [t.device.type for t in moved] == ["cpu", "cpu"]
    assert torch.equal(torch.cat(moved), torch.tensor([0.0, 0.0, 1.0, 1.0]))


def test_nccl_to_hccl() -> None:
    src = "import torch\nimport torch.distributed as dist\ndist.init_process_group(backend='nccl')\n"
    out = _apply("nccl-to-hccl", src).source
    assert "backend=_npuport_dist_backend()" in out and "def _npuport_dist_backend(" in out
    assert not _apply("nccl-to-hccl", "import torch\nx = 'gloo'\n").changed
