"""examples/tiny_llm: the planted hazards are really in the source, the model really fails to import
on this host (its transformers helper is gone), and a copy with every "cuda" turned into "cpu" runs
deterministically, with a KV cache that agrees with full recomputation.

Fakes, all for things outside our walls: transformers 4.34's `_expand_mask` (that release is not
installed here; the stand-in is the helper's documented behaviour), and stand-ins for the CUDA-only
apex / xformers / triton and for NCCL's process-group init.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml

MODEL_DIR = Path(__file__).resolve().parents[1] / "examples" / "tiny_llm"
MODELING = MODEL_DIR / "modeling_tiny_llm.py"
HELPER_MODULE = "transformers.models.llama.modeling_llama"


# ---------------------------------------------------------------------------------------------
# Static: the hazards are in the source
# ---------------------------------------------------------------------------------------------


def _dotted(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef) and n.name == name:
            return n
    raise AssertionError(f"no function {name}")


@pytest.fixture(scope="module")
def tree() -> ast.Module:
    return ast.parse(MODELING.read_text())


def test_h8_unguarded_private_transformers_import_pinned_to_an_old_release(tree: ast.Module) -> None:
    top_level = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == HELPER_MODULE]
    assert top_level and [a.name for a in top_level[0].names] == ["_expand_mask"], "expected an unguarded import"
    assert any(
        isinstance(c.func, ast.Name) and c.func.id == "_expand_mask" for c in _calls(_function(tree, "build_attn_bias"))
    )
    pins = (MODEL_DIR / "requirements.txt").read_text().split()
    assert "transformers==4.34.1" in pins  # the last release whose modeling_llama has _expand_mask
    assert json.loads((MODEL_DIR / "config.json").read_text())["transformers_version"] == "4.34.1"


def test_h3_cuda_only_libraries_imported_with_fallbacks(tree: ast.Module) -> None:
    guarded: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Try):
            handler = node.handlers[0]
            assert _dotted(handler.type) == "ImportError" if handler.type else False
            for imp in node.body:
                if isinstance(imp, ast.Import | ast.ImportFrom):
                    module = imp.module if isinstance(imp, ast.ImportFrom) else imp.names[0].name
                    guarded[module or ""] = ast.unparse(handler)
    assert {"apex.normalization", "xformers.ops", "triton"} <= set(guarded)
    assert all("= None" in text for text in guarded.values()), "each fallback sets the name to None"

    jitted = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and any(_dotted(d) == "triton.jit" for d in n.decorator_list)
    ]
    assert jitted, "expected a @triton.jit kernel"
    guards = [n for n in tree.body if isinstance(n, ast.If) and jitted[0] in n.body]
    assert guards and "triton is not None" in ast.unparse(guards[0].test), "kernel defined only when triton imports"
    swiglu = _function(tree, "swiglu")
    assert any(_dotted(c.func) == "F.silu" for c in _calls(swiglu)), "expected the torch reference path"

    attention = next(
        f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "TinyLlmAttention"
        for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward"
    )
    dotted = {_dotted(c.func) for c in _calls(attention)}
    assert {"xops.memory_efficient_attention", "F.scaled_dot_product_attention"} <= dotted


def test_h1_h9_devices_and_nccl(tree: ast.Module) -> None:
    setup = _function(tree, "setup_device")
    text = ast.unparse(setup)
    assert "CUDA_VISIBLE_DEVICES" in text and "LOCAL_RANK" in text
    inits = [c for c in _calls(setup) if _dotted(c.func) == "dist.init_process_group"]
    assert inits and any(k.arg == "backend" and ast.literal_eval(k.value) == "nccl" for k in inits[0].keywords)
    guard = next(n for n in ast.walk(setup) if isinstance(n, ast.If) and inits[0] in _calls(n))
    assert "WORLD_SIZE" in ast.unparse(guard.test), "nccl init only for multi-process runs"
    dotted = {_dotted(c.func) for c in _calls(tree)}
    assert {"torch.cuda.set_device", "torch.cuda.synchronize", "dist.broadcast"} <= dotted
    generate = _function(tree, "generate")
    assert any(isinstance(c.func, ast.Attribute) and c.func.attr == "cuda" for c in _calls(generate))
    assert any(
        k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cuda"
        for c in _calls(generate) for k in c.keywords
    )


def test_h5_float64_rotary_tables_and_h6_host_sync(tree: ast.Module) -> None:
    rotary = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TinyLlmRotaryEmbedding")
    init = next(f for f in rotary.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assert any(_dotted(n) == "torch.float64" for n in ast.walk(init) if isinstance(n, ast.Attribute))
    assert any(_dotted(c.func) == "self.register_buffer" for c in _calls(init)), "tables kept as float64 buffers"
    loop = next(n for n in ast.walk(_function(tree, "generate")) if isinstance(n, ast.For))
    assert any(isinstance(c.func, ast.Attribute) and c.func.attr == "item" for c in _calls(loop))


def test_manifest_config_and_readme_agree() -> None:
    manifest = yaml.safe_load((MODEL_DIR / "npuport.yaml").read_text())
    config = json.loads((MODEL_DIR / manifest["config"]).read_text())
    module, cls = manifest["entry"]["class"].split(":")
    assert config["auto_map"]["AutoModelForCausalLM"] == f"{module}.{cls}"
    assert config["model_type"] == manifest["name"] == "tiny_llm"
    assert manifest["run"] == {"method": "generate", "kwargs": {"max_new_tokens": 8}}
    assert set(manifest["shrink"]) <= set(config)
    samples = ast.parse((MODEL_DIR / "sample_inputs.py").read_text())
    assert {"make_inputs", "decode"} <= {n.name for n in samples.body if isinstance(n, ast.FunctionDef)}
    readme = (MODEL_DIR / "README.md").read_text()
    for hazard in ("H1", "H3", "H4", "H5", "H6", "H8", "H9"):
        assert f"| {hazard} " in readme, f"README lists {hazard}"
    assert not list(MODEL_DIR.glob("*.safetensors")) and not list(MODEL_DIR.glob("*.bin"))


# ---------------------------------------------------------------------------------------------
# Runtime: the hazard is real here
# ---------------------------------------------------------------------------------------------


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _has_helper() -> bool:
    """Whether the installed transformers defines the helper (read as text: importing it takes seconds)."""
    try:
        source = Path(str(md.distribution("transformers").locate_file(HELPER_MODULE.replace(".", "/") + ".py")))
    except md.PackageNotFoundError:
        return False
    return source.is_file() and "def _expand_mask(" in source.read_text()


@pytest.mark.slow  # importing transformers' llama module takes 10-20 s on a busy 2-core machine
@pytest.mark.skipif(_has_helper(), reason="this host's transformers still has _expand_mask")
def test_import_fails_on_this_host() -> None:
    with pytest.raises(ImportError) as err:
        _load("tiny_llm_original_modeling", MODELING)
    assert "_expand_mask" in str(err.value) or err.value.name == "transformers"


# ---------------------------------------------------------------------------------------------
# Runtime: a CPU copy ("cuda" -> "cpu", stand-ins for what is outside our walls) runs
# ---------------------------------------------------------------------------------------------


def expand_mask(mask: torch.Tensor, dtype: torch.dtype, tgt_len: int | None = None) -> torch.Tensor:
    """transformers 4.34's `_expand_mask`: [b, src] 0/1 -> additive [b, 1, tgt, src], min where 0."""
    b, src = mask.shape
    inverted = 1.0 - mask[:, None, None, :].expand(b, 1, tgt_len or src, src).to(dtype)
    return inverted.masked_fill(inverted.to(torch.bool), torch.finfo(dtype).min)


def _transformers_stub() -> dict[str, types.ModuleType]:
    names = ["transformers", "transformers.models", "transformers.models.llama", HELPER_MODULE]
    modules = {n: types.ModuleType(n) for n in names}
    modules[HELPER_MODULE]._expand_mask = expand_mask  # type: ignore[attr-defined]
    return modules


@dataclass
class CpuCopy:
    path: Path
    samples: types.ModuleType
    config: dict[str, Any]

    def load(self, extra: dict[str, types.ModuleType | None] | None = None) -> types.ModuleType:
        """Import the copied modeling file; CUDA-only libraries absent unless `extra` provides them."""
        modules: dict[str, types.ModuleType | None] = {"apex": None, "apex.normalization": None,
                                                      "xformers": None, "xformers.ops": None,
                                                      "triton": None, "triton.language": None}
        modules.update(_transformers_stub())
        modules.update(extra or {})
        with pytest.MonkeyPatch.context() as mp:
            for name, module in modules.items():
                mp.setitem(sys.modules, name, module)
            return _load(f"tiny_llm_cpu_{len(extra or {})}_{time.monotonic_ns()}", self.path)

    def inputs(self, seed: int = 0) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self.samples.make_inputs(self.config, seed)
        return result


@pytest.fixture(scope="module")
def cpu_copy(tmp_path_factory: pytest.TempPathFactory) -> CpuCopy:
    root = tmp_path_factory.mktemp("tiny_llm_cpu") / "tiny_llm"
    shutil.copytree(MODEL_DIR, root)
    modeling = root / "modeling_tiny_llm.py"
    modeling.write_text(modeling.read_text().replace("cuda", "cpu"))
    samples = _load("tiny_llm_cpu_samples", root / "sample_inputs.py")
    return CpuCopy(modeling, samples, json.loads((root / "config.json").read_text()))


@pytest.fixture(scope="module")
def modeling(cpu_copy: CpuCopy) -> types.ModuleType:
    return cpu_copy.load()


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The model writes CUDA_VISIBLE_DEVICES itself; setenv first so monkeypatch restores the original.
    for key in ("WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(key, "unset")
        monkeypatch.delenv(key)
    yield


def _build(module: types.ModuleType, config: dict[str, Any], **overrides: Any) -> Any:
    torch.manual_seed(0)  # the harness seeds parameters by name; a fixed global seed is enough here
    return module.TinyLlmForCausalLM({**config, **overrides}).eval()


def test_cpu_copy_generates_deterministically_and_stays_small(cpu_copy: CpuCopy, modeling: types.ModuleType) -> None:
    model = _build(modeling, cpu_copy.config)
    inputs = cpu_copy.inputs()
    assert inputs["input_ids"].shape[0] == 2 and (inputs["attention_mask"] == 0).any(), "a left-padded batch"
    first = model.generate(**inputs, max_new_tokens=8)
    second = model.generate(**inputs, max_new_tokens=8)
    assert first.shape == (2, 8) and first.dtype == torch.long
    assert torch.equal(first, second)
    assert int(first.min()) >= 0 and int(first.max()) < cpu_copy.config["vocab_size"]
    # small enough for the demo and CI (the speed itself is bench/port_time.py's, not a timed test's)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert torch.equal(_build(modeling, cpu_copy.config).generate(**inputs, max_new_tokens=8), first)
    assert not torch.equal(first[0], first[1]), "the prompts reach the logits"
    text = cpu_copy.samples.decode(cpu_copy.config, first[0].tolist())
    assert isinstance(text, str) and len(text) <= 8
    assert all(isinstance(m, modeling.TinyLlmRMSNorm) for m in (model.norm, model.layers[0].input_layernorm))


def test_cpu_copy_kv_cache_matches_full_recompute_and_padding(cpu_copy: CpuCopy, modeling: types.ModuleType) -> None:
    model = _build(modeling, cpu_copy.config)
    inputs = cpu_copy.inputs()
    tokens = model.generate(**inputs, max_new_tokens=6)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():
        for step in range(6):
            logits, _ = model(ids, mask)
            next_ids = logits[:, -1].argmax(-1)
            assert torch.equal(next_ids, tokens[:, step])
            ids = torch.cat([ids, next_ids[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    padded_row = int((inputs["attention_mask"][:, 0] == 0).nonzero()[0])
    alone = inputs["input_ids"][padded_row][inputs["attention_mask"][padded_row].bool()][None]
    assert torch.equal(model.generate(alone, max_new_tokens=6)[0], tokens[padded_row]), "padding changes nothing"


def test_cpu_copy_rotary_tables_are_float64(cpu_copy: CpuCopy, modeling: types.ModuleType) -> None:
    model = _build(modeling, cpu_copy.config)
    assert model.rotary_emb.cos_cached.dtype == torch.float64
    cos, _ = model.rotary_emb(torch.arange(4)[None], torch.float32)
    assert cos.dtype == torch.float32


def _fused_stand_ins(calls: dict[str, int]) -> dict[str, types.ModuleType | None]:
    """apex / xformers / triton as a CUDA host has them, computing the reference math (and counting)."""

    class FusedRMSNorm(torch.nn.Module):
        def __init__(self, normalized_shape: int, eps: float = 1e-5) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(normalized_shape))
            self.eps = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls["apex"] += 1
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def memory_efficient_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   attn_bias: torch.Tensor, scale: float) -> torch.Tensor:
        calls["xformers"] += 1
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=attn_bias, scale=scale)
        return out.transpose(1, 2)

    class Launcher:
        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            def run(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor, n: int, BLOCK: int) -> None:
                calls["triton"] += 1
                assert grid == ((n + BLOCK - 1) // BLOCK,)
                out.copy_(F.silu(gate) * up)
            return run

    apex, apex_norm = types.ModuleType("apex"), types.ModuleType("apex.normalization")
    apex_norm.FusedRMSNorm = FusedRMSNorm  # type: ignore[attr-defined]
    xformers, xformers_ops = types.ModuleType("xformers"), types.ModuleType("xformers.ops")
    xformers_ops.memory_efficient_attention = memory_efficient_attention  # type: ignore[attr-defined]
    xformers.ops = xformers_ops  # type: ignore[attr-defined]
    triton, language = types.ModuleType("triton"), types.ModuleType("triton.language")
    triton.jit = lambda fn: Launcher()  # type: ignore[attr-defined]
    triton.cdiv = lambda a, b: (a + b - 1) // b  # type: ignore[attr-defined]
    triton.language = language  # type: ignore[attr-defined]
    language.constexpr = int  # type: ignore[attr-defined]
    return {"apex": apex, "apex.normalization": apex_norm, "xformers": xformers, "xformers.ops": xformers_ops,
            "triton": triton, "triton.language": language}


def test_cpu_copy_fused_paths_and_fallbacks_agree(cpu_copy: CpuCopy, modeling: types.ModuleType) -> None:
    calls = {"apex": 0, "xformers": 0, "triton": 0}
    fused = cpu_copy.load(_fused_stand_ins(calls))
    inputs = cpu_copy.inputs()
    reference = _build(modeling, cpu_copy.config).generate(**inputs)
    assert torch.equal(_build(fused, cpu_copy.config).generate(**inputs), reference)
    assert all(n > 0 for n in calls.values()), calls
    before = dict(calls)
    off = {"use_memory_efficient_attention": False, "use_fused_rms_norm": False, "use_triton_swiglu": False}
    assert torch.equal(_build(fused, cpu_copy.config, **off).generate(**inputs), reference)
    assert calls == before, "the config flags switch every fused path off"


def test_cpu_copy_nccl_only_for_multi_process_runs(
    cpu_copy: CpuCopy, modeling: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    backends: list[str] = []
    monkeypatch.setattr(modeling.dist, "init_process_group", lambda backend: backends.append(backend))
    model = _build(modeling, cpu_copy.config)
    model.generate(**cpu_copy.inputs(), max_new_tokens=1)
    assert backends == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    model.generate(**cpu_copy.inputs(), max_new_tokens=1)
    assert backends == ["nccl"], "torchrun-style runs init NCCL (hccl on Ascend)"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1", "each rank masks the GPUs down to its own"


def test_cpu_copy_shrink_and_eos(cpu_copy: CpuCopy, modeling: types.ModuleType) -> None:
    shrink = yaml.safe_load((MODEL_DIR / "npuport.yaml").read_text())["shrink"]
    small = _build(modeling, cpu_copy.config, **shrink)
    full = _build(modeling, cpu_copy.config)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in full.parameters())
    assert small.generate(**cpu_copy.inputs(), max_new_tokens=8).shape == (2, 8)
    tokens = full.generate(**cpu_copy.inputs(), max_new_tokens=8)
    eos = int(tokens[0, 0])
    stopped = full.generate(**cpu_copy.inputs(), max_new_tokens=8, eos_token_id=eos)
    assert stopped[0, 0] == eos and (stopped[0, 1:] == cpu_copy.config["pad_token_id"]).all()
    assert stopped.shape[1] <= 8
