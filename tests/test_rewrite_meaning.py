"""Every rewrite keeps the code's meaning: the original and the rewritten snippet both run (CPU torch) and
their observable behaviour is compared. Only CUDA itself is missing here; where the original needs it, the
test states what the original meant (e.g. torch.cuda.amp.autocast's float16) and checks the rewrite does it.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.rules.h1_cuda_device import NPU_ADAPTERS, NPU_NAMES, NPU_OPTIONAL, TORCH_CUDA_API, device_agnostic
from agents.rules.h2_autocast import cuda_autocast
from agents.rules.h3_cuda_libraries import guard_cuda_only_imports

ROOT = Path(__file__).resolve().parents[1]
TORCH_CUDA_DOC = ROOT.parent / "shared" / "data" / "ascend-pytorch-docs" / "native_api_2-13-0" / "torch-cuda.md"


def _exec(source: str) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "snippet"}
    exec(compile(source, "snippet.py", "exec"), ns)
    return ns


# --- H2 autocast ---------------------------------------------------------------------------------

@pytest.fixture
def autocast_log() -> Iterator[list[tuple[torch.dtype, bool]]]:
    """Records (dtype, enabled) each autocast context was asked for: what the code means, whether or not
    this host can honour it (CUDA autocast switches itself off without CUDA)."""
    log: list[tuple[torch.dtype, bool]] = []
    cls = torch.amp.autocast_mode.autocast
    orig = cls.__init__
    sig = inspect.signature(orig)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        orig(self, *args, **kwargs)
        log.append((self.fast_dtype, bool(bound.arguments["enabled"])))

    cls.__init__ = init  # type: ignore[method-assign]
    try:
        yield log
    finally:
        cls.__init__ = orig  # type: ignore[method-assign]


AUTOCAST_CASES = [
    "torch.cuda.amp.autocast()",
    "torch.cuda.amp.autocast(flag)",
    "torch.cuda.amp.autocast(enabled=flag)",
    "torch.cuda.amp.autocast(dtype=torch.bfloat16)",
    "torch.cuda.amp.autocast(flag, torch.bfloat16)",
    'torch.autocast("cuda")',
    'torch.autocast(device_type="cuda", enabled=flag)',
    'torch.autocast("cuda", torch.bfloat16)',
]


@pytest.mark.parametrize("ctx", AUTOCAST_CASES)
@pytest.mark.parametrize("flag", [True, False])
@pytest.mark.meaning("cuda-autocast")
def test_autocast_rewrite_keeps_dtype_and_enabled(ctx: str, flag: bool, autocast_log: list[Any]) -> None:
    src = f"import torch\ndef f(a, b, flag):\n    with {ctx}:\n        return a @ b\n"
    result = cuda_autocast(src)
    assert result.changed
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with warnings.catch_warnings():  # the original's CUDA autocast switches itself off here, with a warning
        warnings.simplefilter("ignore")
        _exec(src)["f"](a, b, flag)
    meant = autocast_log.pop()
    out = _exec(result.source)["f"](a, b, flag)
    done = autocast_log.pop()
    assert done == meant  # same dtype and enabled flag, now on the port's device
    # ... and it takes effect: the matmul runs in the dtype the original asked for when enabled
    assert out.dtype == (meant[0] if meant[1] else torch.float32)


# --- H3 guarded imports ----------------------------------------------------------------------------

_TRITON_MODEL = '''\
import torch
import triton
import triton.language as tl
HAS_TRITON = True


@triton.jit
def _kernel(x_ptr, BLOCK: tl.constexpr):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4)], key=["n"])
@triton.jit
def _tuned(x_ptr, n, BLOCK: tl.constexpr):
    pass


class Act(torch.nn.Module):
    def forward(self, x):
        if HAS_TRITON and x.is_cuda:
            _kernel[(1,)](x, BLOCK=64)
            return x
        return torch.nn.functional.gelu(x)


def run():
    torch.manual_seed(0)
    return Act()(torch.randn(8)).tolist(), HAS_TRITON
'''

# The original imports a real triton where it runs; here a minimal stand-in package plays that part so the
# original imports (its kernels are never launched on CPU tensors).
_FAKE_TRITON = {
    "triton/__init__.py": "def jit(fn):\n    return fn\n"
                          "def autotune(**kw):\n    return lambda fn: fn\n"
                          "class Config:\n    def __init__(self, *a, **k):\n        pass\n",
    "triton/language.py": "constexpr = int\n",
}


def _run_module(tmp: Path, source: str, block: tuple[str, ...] = (), extra: dict[str, str] | None = None) -> Any:
    tmp.mkdir(parents=True, exist_ok=True)
    for rel, text in (extra or {}).items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    (tmp / "model_mod.py").write_text(source)
    blocker = "".join(f"sys.modules[{b!r}] = None\n" for b in block)  # import of it raises ImportError
    code = f"import sys\nsys.path.insert(0, {str(tmp)!r})\n{blocker}import model_mod\nprint(repr(model_mod.run()))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307  our own repr of lists/bools


@pytest.mark.meaning("guard-cuda-only-imports")
def test_guarded_triton_import_keeps_module_usable_and_routes_to_the_fallback(tmp_path: Path) -> None:
    original = _run_module(tmp_path / "orig", _TRITON_MODEL, extra=_FAKE_TRITON)
    result = guard_cuda_only_imports(_TRITON_MODEL)
    assert result.changed
    ported = _run_module(tmp_path / "port", result.source, block=("triton", "triton.language"))
    assert ported[0] == original[0]  # same numbers through the model's own torch path
    assert ported[1] is False  # the model's flag says the kernel path is off


def test_guarded_import_keeps_none_when_the_model_checks_for_none(tmp_path: Path) -> None:
    src = (
        "import torch\nfrom xformers.ops import memory_efficient_attention as mea\n"
        "def run():\n"
        "    q = torch.ones(1, 2, 4)\n"
        "    if mea is None:\n"
        "        return torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().item()\n"
        "    return mea(q, q, q).sum().item()\n"
    )
    result = guard_cuda_only_imports(src)
    assert "mea = None" in result.source
    assert _run_module(tmp_path, result.source, block=("xformers", "xformers.ops")) == pytest.approx(8.0)


def test_stand_in_raises_naming_the_library_when_called_on_tensors(tmp_path: Path) -> None:
    src = "import torch\nimport flash_attn\ndef run():\n    return flash_attn.flash_attn_func(torch.ones(2))\n"
    port = guard_cuda_only_imports(src).source
    (tmp_path / "model_mod.py").write_text(port)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nsys.modules['flash_attn'] = None\n"
            "import model_mod\nmodel_mod.run()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "flash_attn.flash_attn_func belongs to a CUDA-only library" in proc.stderr


# --- H1 device APIs --------------------------------------------------------------------------------

def _documented_npu_names() -> dict[str, str]:
    text = TORCH_CUDA_DOC.read_text(encoding="utf-8")
    out: dict[str, str] = {}
    heads = list(re.finditer(r"^###\s+(?:<code><i>class</i></code>\s+)?torch\.cuda\.([\w.]+)\s*$", text, re.M))
    for i, h in enumerate(heads):
        body = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        m = re.search(r"\*\*NPU 形式名称\*\*：\s*(?:torch_npu|torch)\.npu\.([\w.]+)", body)
        if m:
            out[h.group(1)] = m.group(1)
    return out


@pytest.mark.skipif(not TORCH_CUDA_DOC.exists(), reason="needs ../shared/data (torch_npu's native-API list)")
def test_device_api_rewrites_name_only_apis_torch_npu_documents() -> None:
    documented = _documented_npu_names()
    assert documented.get("CUDAGraph") == "NPUGraph"  # the list says so; torch.npu.CUDAGraph does not exist
    for api in TORCH_CUDA_API:
        if api not in documented:
            continue
        out = device_agnostic(f"import torch\ntorch.cuda.{api}()\n").source.splitlines()[-1]
        npu = NPU_NAMES.get(api, api)
        assert npu == documented[api], api
        if api in NPU_ADAPTERS:
            assert f"{NPU_ADAPTERS[api]}()" in out, api
        else:
            assert f'_npuport_api("{npu}")()' in out if npu in NPU_OPTIONAL else f"_npuport_backend().{npu}()" in out


_DEVICE_SNIPPET = '''\
import torch

def run():
    assert torch.cuda.is_available(), "needs a GPU"
    props = torch.cuda.get_device_properties(0)
    s = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        start.record()
        y = torch.ones(4).cuda() * 2
        end.record()
    torch.cuda.synchronize()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        z = y + 1
    free, total = torch.cuda.mem_get_info()
    return (y.tolist(), z.tolist(), type(props.total_memory), type(props.name), props.major, props.minor,
            props.multi_processor_count > 0, start.elapsed_time(end) >= 0, free <= total,
            torch.cuda.memory_allocated() >= 0)
'''


def test_cpu_stand_ins_are_real_objects_and_the_assert_holds() -> None:
    port = device_agnostic(_DEVICE_SNIPPET).source
    assert "torch.cuda" not in port.split("def run", 1)[1]
    y, z, mem_t, name_t, major, minor, sms, timed, mem_ok, alloc = _exec(port)["run"]()
    assert (y, z) == ([2.0] * 4, [3.0] * 4)
    assert (mem_t, name_t, type(major), type(minor), sms, timed, mem_ok, alloc) == (int, str, int, int, True, True,
                                                                                   True, True)


@pytest.mark.meaning("device-agnostic")
def test_the_reference_redirect_runs_the_same_snippet_with_the_same_results(tmp_path: Path) -> None:
    """The original, under the cuda->cpu redirect, and the port agree."""
    (tmp_path / "model_mod.py").write_text(_DEVICE_SNIPPET)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nfrom sandbox.cuda_redirect import "
            "redirect\nredirect.install('cpu')\nimport model_mod\nprint(repr(model_mod.run()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reference = proc.stdout.strip().splitlines()[-1]
    ported = _exec(device_agnostic(_DEVICE_SNIPPET).source)["run"]()
    assert reference == repr(ported)


class _DocumentedNpuProps:
    """What torch_npu's get_device_properties() gives (native-API notes: only name, total_memory,
    L2_cache_size, cube_core_num and vector_core_num are filled; CUDA's other fields come back empty)."""

    name, total_memory, L2_cache_size, cube_core_num, vector_core_num = "Ascend910B", 64 * 2**30, 0, 24, 48
    major = minor = multi_processor_count = None


def _documented_torch_npu(capability: Any = None) -> types.SimpleNamespace:
    """The NPU device API as torch_npu documents it: get_device_capability() is None unless
    TORCH_NPU_DEVICE_CAPABILITY is set (then that major.minor)."""
    return types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0,
                                 get_device_capability=lambda *a, **k: capability,
                                 get_device_properties=lambda *a, **k: _DocumentedNpuProps())


_CAPABILITY_SNIPPET = '''\
import torch

MAJOR = torch.cuda.get_device_capability(0)[0]
USE_FLASH = torch.cuda.get_device_capability() >= (8, 0)
PROPS = torch.cuda.get_device_properties(0)
SMS = PROPS.multi_processor_count
BF16_FAST = PROPS.major >= 8
'''


@pytest.mark.meaning("device-agnostic")
def test_device_queries_return_what_cuda_code_reads_on_a_real_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    """`torch.cuda.get_device_capability(0)[0]` rewritten to torch_npu's call would be `None[0]` at import
    on an Ascend host; the port reads (0, 0) there (no CUDA capability: the portable branch), the
    configured capability where TORCH_NPU_DEVICE_CAPABILITY is set, and the CPU's (0, 0) here."""
    port = device_agnostic(_CAPABILITY_SNIPPET).source
    monkeypatch.setattr(torch, "npu", _documented_torch_npu(), raising=False)
    with pytest.raises(TypeError):  # what the plain rename would do on that host
        _exec(_CAPABILITY_SNIPPET.replace("torch.cuda.", "torch.npu."))
    ns = _exec(port)
    assert (ns["MAJOR"], ns["USE_FLASH"], ns["SMS"], ns["BF16_FAST"]) == (0, False, 24, False)
    assert (ns["PROPS"].name, ns["PROPS"].total_memory) == ("Ascend910B", 64 * 2**30)
    monkeypatch.setattr(torch, "npu", _documented_torch_npu((8, 0)), raising=False)
    ns = _exec(port)
    assert (ns["MAJOR"], ns["USE_FLASH"]) == (8, True)
    monkeypatch.delattr(torch, "npu", raising=False)
    ns = _exec(port)  # no NPU: the CPU stand-in
    assert (ns["MAJOR"], ns["USE_FLASH"], ns["BF16_FAST"]) == (0, False, False)


def test_graph_api_falls_back_to_eager_when_the_npu_module_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NPU build without NPUGraph (like ascend-sim): the rewrite takes the eager stand-in, never a
    missing attribute."""
    fake_npu = types.SimpleNamespace(is_available=lambda: True, current_device=lambda: 0)
    monkeypatch.setattr(torch, "npu", fake_npu, raising=False)
    ns = _exec(device_agnostic("import torch\ndef g():\n    return torch.cuda.CUDAGraph()\n").source)
    graph = ns["g"]()
    assert type(graph).__name__ == "_NpuportCpuGraph"
    graph.replay()  # nothing was captured: nothing to run again


_GRAPH_SNIPPET = '''\
import torch

def run():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    static_x, cache, pos = torch.zeros(1, 4), torch.zeros(3, 4), torch.tensor([0])

    def step():
        y = torch.tanh(lin(static_x))
        cache.index_copy_(0, pos, y)
        return y * 2 + cache.sum(0)

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    res = []
    for i in range(3):
        static_x.copy_(torch.full((1, 4), float(i)))
        pos.fill_(i)
        g.replay()
        res.append(out.clone())
    cache.zero_()
    eager = []
    for i in range(3):
        static_x.copy_(torch.full((1, 4), float(i)))
        pos.fill_(i)
        eager.append(step())
    return [round(float(r.sum()), 5) for r in res], all(torch.allclose(a, b) for a, b in zip(res, eager))
'''


@pytest.mark.meaning("device-agnostic")
def test_graph_capture_and_replay_compute_what_eager_steps_compute(tmp_path: Path) -> None:
    """A captured step replayed on new static inputs (CUDA-graph style) gives the eager step's results, in
    the port (CPU graph stand-in) and in the reference (the redirect's graph), and the two agree."""
    (tmp_path / "model_mod.py").write_text(_GRAPH_SNIPPET)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nfrom sandbox.cuda_redirect import "
            "redirect\nredirect.install('cpu')\nimport model_mod\nprint(repr(model_mod.run()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ported = _exec(device_agnostic(_GRAPH_SNIPPET).source)["run"]()
    assert ported[1] is True and proc.stdout.strip().splitlines()[-1] == repr(ported)


def test_reference_stubs_import_submodules_and_are_inert_at_import_time(tmp_path: Path) -> None:
    src = textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl
        from triton.language import constexpr

        @triton.jit
        def kern(x, B: tl.constexpr):
            return x

        class Base(triton.Base):
            pass

        def run():
            return kern(2, 3), Base.__mro__[-1] is object
    ''')
    (tmp_path / "model_mod.py").write_text(src)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nsys.modules['triton'] = None\n"
            "del sys.modules['triton']\nfrom sandbox.cuda_redirect import redirect\nredirect.install('cpu')\n"
            "redirect.stub_module('triton')\nimport model_mod\nprint(repr(model_mod.run()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "(2, True)"


def test_reference_run_computes_documented_attention_of_stubbed_libraries(tmp_path: Path) -> None:
    """The original calls flash-attn / xformers directly: under the redirect they compute the attention the
    libraries document, so the reference run goes on (the port's SDPA rewrite is checked against it)."""
    src = textwrap.dedent('''\
        import torch
        import xformers.ops as xops
        from flash_attn import flash_attn_func

        def run():
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 5, 2, 4, generator=g) for _ in range(3))
            a = flash_attn_func(q, k, v, causal=True)
            b = xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
            return torch.allclose(a, ref), torch.allclose(b, ref)
    ''')
    (tmp_path / "model_mod.py").write_text(src)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nfrom sandbox.cuda_redirect import "
            "redirect\nredirect.install('cpu')\nredirect.stub_module('xformers')\nredirect.stub_module('flash_attn')\n"
            "import model_mod\nprint(repr(model_mod.run()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "(True, True)"


def test_reference_run_runs_graph_compile_modes_eagerly(tmp_path: Path) -> None:
    src = ("import torch\nlin = torch.compile(torch.nn.Linear(2, 2), mode='reduce-overhead')\n"
           "@torch.compile(mode='max-autotune')\ndef f(x):\n    return x + 1\n"
           "def run():\n    return type(lin).__name__, f(torch.zeros(1).pin_memory()).tolist()\n")
    (tmp_path / "model_mod.py").write_text(src)
    code = (f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nfrom sandbox.cuda_redirect import "
            "redirect\nredirect.install('cpu')\nimport model_mod\nprint(repr(model_mod.run()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "('Linear', [1.0])"
