"""The hazard classes H12-H16: each detector on positive and negative snippets, and the codemods run
original vs rewritten (the CUDA-only library's documented semantics written out by hand where it cannot be
installed here)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.models import Severity
from agents.reading.scanner import scan_source
from agents.rules.h14_host_memory import guard_pin_memory
from agents.rules.h15_graph_compile import compile_eager, default_jit_executor
from agents.rules.h16_attention_calls import attention_to_sdpa


def _rules(src: str) -> list[tuple[str, str, int, bool]]:
    return [(f.hazard, f.rule, f.line, f.fixable) for f in scan_source(src, "m.py")
            if f.hazard in ("H12", "H13", "H14", "H15", "H16")]


def test_fp16_weights_are_found_and_fp32_is_not() -> None:
    src = ("import torch\nm = torch.nn.Linear(2, 2).half()\nx = torch.zeros(2, dtype=torch.float16)\n"
           "y = x.to(torch.half)\nz = torch.zeros(2, dtype=torch.float32)\ntorch.set_default_dtype(torch.float16)\n")
    assert _rules(src) == [("H12", "fp16-weights", 2, True), ("H12", "fp16-weights", 3, True),
                           ("H12", "fp16-weights", 4, True), ("H12", "fp16-weights", 6, True)]


def test_kernel_path_flags() -> None:
    src = ("triton_enabled = True\nuse_flash_attn = False\nclass C:\n    def __init__(self, use_xformers=True):\n"
           "        self.fused_rmsnorm = True\nbuild(use_triton=True, verbose=True)\n")
    assert [(r, line) for _, r, line, _ in _rules(src)] == [("kernel-path-flag", 1), ("kernel-path-flag", 4),
                                                            ("kernel-path-flag", 5), ("kernel-path-flag", 6)]


def test_pinned_memory_async_copies_and_is_cuda_branches() -> None:
    src = ("import torch\ndef f(x, loader):\n    x = x.pin_memory()\n    y = x.to('cpu', non_blocking=True)\n"
           "    dl = loader(pin_memory=True)\n    if x.is_cuda:\n        return y\n    return x\n"
           "def g(x):\n    return x.to('cpu', non_blocking=False)\n")
    assert [(r, line) for _, r, line, _ in _rules(src)] == [("pin-memory", 3), ("non-blocking-copy", 4),
                                                            ("pin-memory-loader", 5), ("is-cuda-branch", 6)]


def test_cuda_graphs_and_graph_compile_modes() -> None:
    src = ("import torch\nm = torch.compile(torch.nn.Linear(2, 2), mode='reduce-overhead')\n"
           "n = torch.compile(torch.nn.Linear(2, 2))\ng = torch.cuda.CUDAGraph()\n")
    assert [(r, line, fx) for _, r, line, fx in _rules(src)] == [("compile-graph-mode", 2, True),
                                                                 ("cuda-graph", 4, False)]


@pytest.mark.meaning("compile-eager")
def test_compile_eager_runs_the_same_function() -> None:
    src = ("import torch\n@torch.compile(mode='reduce-overhead')\ndef f(x):\n    return x * 2 + 1\n"
           "lin = torch.compile(torch.nn.Identity(), mode='max-autotune')\nkeep = torch.compile(torch.nn.Identity())\n")
    out = compile_eager(src)
    assert out.changed and len(out.edits) == 2 and "mode=" not in out.source
    ns: dict[str, Any] = {}
    exec(compile(out.source, "m.py", "exec"), ns)
    x = torch.arange(4.0)
    assert torch.equal(ns["f"](x), x * 2 + 1) and isinstance(ns["lin"], torch.nn.Identity)
    assert "torch.compile(torch.nn.Identity())" in out.source  # the default mode stays


LEGACY_JIT = ("import sys, torch\n"
              "torch._C._jit_set_profiling_mode(False)\n"
              "torch._C._jit_set_profiling_executor(False)\n"
              "torch._C._jit_override_can_fuse_on_gpu(True)\n"
              "@torch.jit.script\n"
              "def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:\n"
              "    return torch.sigmoid(x * y + 1.0) * x\n"
              "g = torch.Generator().manual_seed(0)\n"
              "x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)\n"
              "dev = sys.argv[1]\n"
              "outs = [f(x.to(dev), y.to(dev)) for _ in range(3)]\n"
              "print(outs[-1].tolist() if dev == 'cpu' else 'ran on ' + dev)\n")


def test_the_legacy_jit_executor_is_found() -> None:
    assert [(r, line, fx) for _, r, line, fx in _rules(LEGACY_JIT)] == [("legacy-jit-fuser", 2, True),
                                                                        ("legacy-jit-fuser", 3, True)]


@pytest.mark.meaning("default-jit-executor")
def test_default_jit_executor_computes_the_same_and_runs_on_other_devices(tmp_path: Path) -> None:
    """The legacy executor's fuser raises on a device it does not know (meta stands in for the NPU, as
    the fuser knows only CPU and CUDA); the rewrite computes the same on the CPU and runs there. The JIT
    switches are process-wide, so each side runs in its own interpreter."""
    out = default_jit_executor(LEGACY_JIT)
    assert out.changed and len(out.edits) == 2 and "(False)" not in out.source
    assert "_jit_override_can_fuse_on_gpu(True)" in out.source  # a fuser switch alone selects no executor
    runs = {}
    for name, src in (("original", LEGACY_JIT), ("rewritten", out.source)):
        (tmp_path / f"{name}.py").write_text(src)
        runs[name] = {dev: subprocess.run([sys.executable, str(tmp_path / f"{name}.py"), dev], capture_output=True,
                                          text=True, timeout=120) for dev in ("cpu", "meta")}
    assert runs["original"]["cpu"].returncode == 0 and runs["rewritten"]["cpu"].returncode == 0
    assert runs["original"]["cpu"].stdout == runs["rewritten"]["cpu"].stdout  # same numbers
    assert "Unknown device for graph fuser" in runs["original"]["meta"].stderr
    assert runs["rewritten"]["meta"].returncode == 0 and "ran on meta" in runs["rewritten"]["meta"].stdout


@pytest.mark.meaning("default-jit-executor")
def test_cpu_fusion_the_legacy_setup_asked_for_is_switched_off_with_the_default_executor(tmp_path: Path) -> None:
    """ChatGLM's setup also asks for CPU fusion (`_jit_override_can_fuse_on_cpu(True)`): under the default
    executor that is NNC, which needs LLVM ("LLVM Backend not found" on a cpu-target run). The rewrite turns it
    off with the executor switch; the scripted function computes what eager torch does."""
    src = LEGACY_JIT.replace("torch._C._jit_override_can_fuse_on_gpu(True)\n",
                             "torch._C._jit_override_can_fuse_on_gpu(True)\ntorch._C._jit_override_can_fuse_on_cpu(True)\n")
    out = default_jit_executor(src)
    assert "_jit_override_can_fuse_on_cpu(False)" in out.source and len(out.edits) == 3
    half = out.source.replace("_jit_override_can_fuse_on_cpu(False)", "_jit_override_can_fuse_on_cpu(True)")
    runs = {}
    for name, code in (("rewritten", out.source), ("executor_only", half)):
        (tmp_path / f"{name}.py").write_text(code)
        runs[name] = subprocess.run([sys.executable, str(tmp_path / f"{name}.py"), "cpu"], capture_output=True,
                                    text=True, timeout=120)
    assert runs["rewritten"].returncode == 0, runs["rewritten"].stderr[-800:]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    assert runs["rewritten"].stdout.strip() == str((torch.sigmoid(x * y + 1.0) * x).tolist())
    if runs["executor_only"].returncode != 0:  # a torch built without LLVM: the half rewrite fails as ChatGLM did
        assert "LLVM" in runs["executor_only"].stderr


def _reference_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                    causal: bool = False) -> torch.Tensor:
    """Attention as xformers / flash-attn document it, on (batch, seq, heads, dim); flash-attn's causal
    mask is aligned to the bottom right."""
    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    s = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    att = torch.einsum("bqhd,bkhd->bhqk", q, k) * s
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        mask = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        att = att.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v)


ATTN_CASES = [
    ("import xformers.ops as xops\ndef f(q, k, v):\n    return xops.memory_efficient_attention(q, k, v)\n", {}),
    ("import xformers.ops as xops\ndef f(q, k, v):\n    return xops.memory_efficient_attention(q, k, v, "
     "attn_bias=xops.LowerTriangularMask(), scale=0.3)\n", {"causal": True, "scale": 0.3}),
    ("from flash_attn import flash_attn_func\ndef f(q, k, v):\n    return flash_attn_func(q, k, v, 0.0, None, True)\n",
     {"causal": True}),
    ("from flash_attn import flash_attn_func\ndef f(q, k, v):\n"
     "    return flash_attn_func(q, k, v, softmax_scale=0.2)\n", {"scale": 0.2}),
]


@pytest.mark.parametrize(("src", "meant"), ATTN_CASES)
@pytest.mark.parametrize("kv_len", [6, 9])
@pytest.mark.meaning("attention-to-sdpa")
def test_attention_calls_to_sdpa_compute_the_documented_attention(src: str, meant: dict[str, Any],
                                                                   kv_len: int) -> None:
    found = _rules(src)
    assert len(found) == 1 and found[0][3] is True
    out = attention_to_sdpa(src)
    assert out.changed and "_npuport_sdpa_bshd(q, k, v" in out.source
    body = "\n".join(ln for ln in out.source.splitlines()
                     if "import xformers" not in ln and "import flash_attn" not in ln)
    ns: dict[str, Any] = {}
    exec(compile(body, "m.py", "exec"), ns)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 4, 8, generator=g)
    k, v = torch.randn(2, kv_len, 2, 8, generator=g), torch.randn(2, kv_len, 2, 8, generator=g)
    torch.testing.assert_close(ns["f"](q, k, v), _reference_bshd(q, k, v, **meant))


def test_attention_options_without_an_exact_sdpa_form_are_left_to_a_person() -> None:
    src = ("from flash_attn import flash_attn_func\ndef f(q, k, v):\n"
           "    return flash_attn_func(q, k, v, window_size=(8, 0))\n")
    assert _rules(src) == [("H16", "flash-attn-call", 3, False)]
    assert not attention_to_sdpa(src).changed


def test_collectives_on_a_process_group_are_found() -> None:
    src = ("import torch.distributed as dist\ndef f(x):\n    dist.init_process_group('nccl')\n"
           "    dist.all_reduce(x)\n    g = dist.new_group([0])\n    return dist.get_rank()\n")
    found = [(f.rule, f.line) for f in scan_source(src, "m.py") if f.hazard == "H9"]
    assert ("collective-call", 4) in found and ("collective-call", 5) in found
    assert ("nccl-backend", 3) in found and not any(line == 6 for _, line in found)


@pytest.mark.meaning("guard-pin-memory")
def test_pin_memory_rewrite_keeps_values_where_the_device_cannot_pin() -> None:
    src = "import torch\ndef f(x):\n    return x.pin_memory() * 2\n"
    out = guard_pin_memory(src)
    assert out.changed and "_npuport_pin(x) * 2" in out.source
    ns: dict[str, Any] = {}
    exec(compile(out.source, "m.py", "exec"), ns)
    x = torch.arange(3.0)
    assert torch.equal(ns["f"](x), x * 2)  # this host has no accelerator: x.pin_memory() itself raises here
    with pytest.raises(RuntimeError):
        exec(compile(src, "o.py", "exec"), ns)
        ns["f"](x)


_HARD_WIRED = '''\
import torch
from torch import nn


class FlashSelfAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        from flash_attn import flash_attn_func  # CUDA-only: not installed here, nor on Ascend
        self.fn = flash_attn_func


class SelfAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.use_flash_attention = True
        if self.use_flash_attention:
            self.attn = FlashSelfAttention(dim)
        else:
            self.attn = SelfAttention(dim)

    def forward(self, x):
        return self.attn(x)
'''


def test_a_hard_wired_flash_path_is_a_fixable_blocker_and_the_config_flag_is_not() -> None:
    (found,) = [f for f in scan_source(_HARD_WIRED, "m.py") if f.hazard == "H13"]
    assert (found.rule, found.line, found.fixable, found.severity) == ("hard-wired-kernel-path", 25, True,
                                                                       Severity.HIGH)
    # set from the config or an argument: the user's switch, left as a note
    configured = _HARD_WIRED.replace("self.use_flash_attention = True", "self.use_flash_attention = dim > 0")
    assert [f.rule for f in scan_source(configured, "m.py") if f.hazard == "H13"] == []
    no_else = "use_flash_attn = True\nif use_flash_attn:\n    import flash_attn\n"  # no torch branch to switch to
    assert [(f.rule, f.fixable) for f in scan_source(no_else, "m.py") if f.hazard == "H13"] == \
        [("kernel-path-flag", False)]


@pytest.mark.meaning("kernel-path-off")
def test_switching_the_hard_wired_flag_off_runs_the_models_own_torch_branch() -> None:
    """The original fails at construction (the flash module imports flash_attn); the port builds the
    model's SDPA branch and computes exactly what that branch of the original computes."""
    from agents.rules.h13_kernel_flags import kernel_path_off

    original: dict[str, Any] = {}
    exec(compile(_HARD_WIRED, "orig.py", "exec"), original)
    with pytest.raises(ModuleNotFoundError):
        original["Block"](8)
    result = kernel_path_off(_HARD_WIRED)
    assert result.changed and result.spans == [(25, 25)] and "self.use_flash_attention = False" in result.source
    ported: dict[str, Any] = {}
    exec(compile(result.source, "port.py", "exec"), ported)
    torch.manual_seed(0)
    block = ported["Block"](8)
    torch.manual_seed(0)
    eager = original["SelfAttention"](8)  # the original's own torch branch, same weights
    x = torch.randn(2, 5, 8)
    assert torch.equal(block(x), eager(x))


_BUILD_ASSERT = '''\
import torch
from torch import nn

try:
    from flash_attn.flash_attn_interface import flash_attn_unpadded_func
except ImportError:
    flash_attn_unpadded_func = None


class FlashSelfAttention(nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        assert flash_attn_unpadded_func is not None, "Please install FlashAttention first"
        self.causal = causal

    def forward(self, q, k, v):
        return flash_attn_unpadded_func(q, k, v, causal=self.causal)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.qkv = nn.Linear(8, 24)
        self.core_attention_flash = FlashSelfAttention(causal=True)  # built whatever the flag says

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        if self.config["flash_attn"]:
            return self.core_attention_flash(q, k, v)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
'''


def test_a_constructor_assert_on_a_cuda_only_kernel_is_a_fixable_blocker() -> None:
    found = [(f.rule, f.line, f.fixable) for f in scan_source(_BUILD_ASSERT, "m.py") if f.hazard == "H13"]
    assert found == [("kernel-assert-at-build", 13, True)]
    plain = _BUILD_ASSERT.replace("flash_attn_unpadded_func is not None", "causal is not None")
    assert not [f for f in scan_source(plain, "m.py") if f.rule == "kernel-assert-at-build"]


@pytest.mark.meaning("defer-kernel-assert")
def test_the_module_builds_without_the_kernel_and_the_torch_path_computes_the_same() -> None:
    """Without flash_attn (here, on Ascend) the original cannot be built at all; the port builds, and with the
    config's kernel flag off (what the harness sets, sandbox/cuda_redirect/cuda_only.py) it computes the original's
    torch branch exactly."""
    from agents.rules.h13_kernel_flags import defer_kernel_asserts
    from sandbox.cuda_redirect.cuda_only import kernel_flags_off

    config = {"flash_attn": True, "text": {"use_flash_attention": True, "use_cache": True}}
    changes = kernel_flags_off(config)
    assert config == {"flash_attn": False, "text": {"use_flash_attention": False, "use_cache": True}}
    assert [c.split(":")[0] for c in changes] == ["flash_attn", "text.use_flash_attention"]
    original: dict[str, Any] = {}
    exec(compile(_BUILD_ASSERT, "orig.py", "exec"), original)
    with pytest.raises(AssertionError, match="FlashAttention"):
        original["Attention"](config)
    result = defer_kernel_asserts(_BUILD_ASSERT)
    assert result.changed and result.spans == [(13, 13)] and "assert" not in result.source
    ported: dict[str, Any] = {}
    exec(compile(result.source, "port.py", "exec"), ported)
    torch.manual_seed(0)
    attn = ported["Attention"](config)
    x = torch.randn(1, 4, 8)
    q, k, v = attn.qkv(x).chunk(3, -1)
    assert torch.equal(attn(x), torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_the_reference_run_and_the_patched_code_share_one_sdpa_definition() -> None:
    """The helper the codemod inserts is the function the reference run's flash-attn / xformers stand-ins
    call (sandbox/cuda_redirect/sdpa.py), not a second copy."""
    import ast
    import inspect

    from sandbox.cuda_redirect import redirect, sdpa

    def helper_def(text: str) -> str:
        tree = ast.parse(text)
        return next(ast.dump(n) for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef) and n.name == "_npuport_sdpa_bshd")

    inserted = attention_to_sdpa(ATTN_CASES[0][0]).source
    assert helper_def(inserted) == helper_def(inspect.getsource(sdpa))
    assert redirect._npuport_sdpa_bshd is sdpa._npuport_sdpa_bshd
