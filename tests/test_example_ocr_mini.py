"""examples/ocr_mini: the planted CUDA hazards are really in the source, the model really fails to
import on a CPU-only host, and a copy with every "cuda" turned into "cpu" runs deterministically.

The only fake here is `flash_attn` (a CUDA-only library, outside our walls): a stand-in module with
a reference causal attention that counts its calls.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

MODEL_DIR = Path(__file__).resolve().parents[1] / "examples" / "ocr_mini"
MODELING = MODEL_DIR / "modeling_ocr_mini.py"

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.cpu.amp.autocast is deprecated


# ---------------------------------------------------------------------------------------------
# Static: the hazards are in the source
# ---------------------------------------------------------------------------------------------


def _dotted(node: ast.AST) -> str:
    """`torch.cuda.amp.autocast` for the matching Attribute chain; '' for anything else."""
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


def _method_calls(node: ast.AST, attr: str) -> list[ast.Call]:
    return [c for c in _calls(node) if isinstance(c.func, ast.Attribute) and c.func.attr == attr]


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef) and n.name == name:
            return n
    raise AssertionError(f"no function {name}")


def _is_str(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


@pytest.fixture(scope="module")
def tree() -> ast.Module:
    return ast.parse(MODELING.read_text(encoding="utf-8"))


def test_h3_flash_attn_imported_unguarded_at_top_level(tree: ast.Module) -> None:
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "flash_attn"]
    assert imports, "expected a bare top-level `from flash_attn import ...`"
    names = {a.name for a in imports[0].names}
    assert "flash_attn_func" in names
    # One imported name is never used: the "unused import" flavour of the hazard.
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert names - used, "expected at least one flash_attn name that is imported but unused"


def test_h3_h4_fused_path_is_behind_a_flag_that_is_off(tree: ast.Module) -> None:
    flagged = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and "use_flash_attn" in ast.unparse(n.test)
        and "flash_attention_2" in ast.unparse(n.test)
    ]
    assert flagged, "expected `if config.use_flash_attn or impl == 'flash_attention_2':`"
    assert any(
        isinstance(c.func, ast.Name) and c.func.id == "flash_attn_func"
        for n in flagged
        for s in n.body
        for c in _calls(s)
    )
    assert any(isinstance(n, ast.Attribute) and n.attr == "_attn_implementation" for n in ast.walk(tree))
    config = json.loads((MODEL_DIR / "config.json").read_text())
    assert config["use_flash_attn"] is False
    assert config["_attn_implementation"] == "eager"


def test_h1_hard_coded_cuda(tree: ast.Module) -> None:
    calls = _calls(tree)
    assert any(not c.args and not c.keywords for c in _method_calls(tree, "cuda")), (
        "expected a bare .cuda() call"
    )
    assert any(any(k.arg == "device" and _is_str(k.value, "cuda") for k in c.keywords) for c in calls)
    assert any(_dotted(c.func) == "torch.device" and c.args and _is_str(c.args[0], "cuda") for c in calls)
    dotted = {_dotted(c.func) for c in calls}
    assert {"torch.cuda.synchronize", "torch.cuda.is_available"} <= dotted


def test_h2_cuda_autocast(tree: ast.Module) -> None:
    calls = _calls(tree)
    assert any(_dotted(c.func) == "torch.autocast" and c.args and _is_str(c.args[0], "cuda") for c in calls)
    assert any(_dotted(c.func) == "torch.cuda.amp.autocast" for c in calls)


def test_h5_float64_in_a_forward_pass(tree: ast.Module) -> None:
    forwards = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    assert any(
        _dotted(n) == "torch.float64" for f in forwards for n in ast.walk(f) if isinstance(n, ast.Attribute)
    ), "expected torch.float64 computed in a forward pass (on the device)"


def test_h6_host_syncs_and_python_loops(tree: ast.Module) -> None:
    assert any(
        isinstance(c.func, ast.Attribute)
        and isinstance(c.func.value, ast.Call)
        and isinstance(c.func.value.func, ast.Attribute)
        and c.func.value.func.attr == "cpu"
        for c in _method_calls(tree, "numpy")
    ), "expected a `.cpu().numpy()` chain"
    assert _method_calls(tree, "item")
    moe_infer = _function(tree, "moe_infer")
    expert_loops = [
        f
        for f in ast.walk(moe_infer)
        if isinstance(f, ast.For)
        and any(_dotted(s.value) == "self.experts" for s in ast.walk(f) if isinstance(s, ast.Subscript))
    ]
    assert expert_loops, "expected a Python loop over experts"
    assert _method_calls(expert_loops[0], "item"), "expected a per-expert .item() sync"
    mask_builder = _function(tree, "build_encoder_mask")
    assert any(isinstance(n, ast.For) for n in ast.walk(mask_builder))


def test_masked_scatter_with_a_mask_moved_by_cuda(tree: ast.Module) -> None:
    fn = _function(tree, "prepare_inputs_embeds")
    assert _method_calls(fn, "masked_scatter_")
    assert _method_calls(fn, "cuda")


def test_h11_cat_mixes_the_model_device_with_a_device_check_idiom(tree: ast.Module) -> None:
    device_names = {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.IfExp)
        and _dotted(getattr(n.value.test, "func", n.value.test)) == "torch.cuda.is_available"
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert device_names, "expected `X = 'cuda' if torch.cuda.is_available() else 'cpu'` at module level"

    def device_of(call: ast.AST) -> str:
        kw = [k.value for k in getattr(call, "keywords", []) if k.arg == "device"]
        return ast.unparse(kw[0]) if kw else ""

    mixed = [
        c
        for c in _calls(tree)
        if _dotted(c.func) == "torch.cat"
        and c.args
        and isinstance(c.args[0], ast.List)
        and {device_of(e) for e in c.args[0].elts} & device_names
        and any(device_of(e).endswith(".device") for e in c.args[0].elts)
    ]
    assert mixed, "expected a torch.cat of a tensor on x.device and one on the device-check idiom's device"


def test_manifest_config_and_tokenizer_agree() -> None:
    manifest = yaml.safe_load((MODEL_DIR / "npuport.yaml").read_text())
    config = json.loads((MODEL_DIR / manifest["config"]).read_text())
    module, cls = manifest["entry"]["class"].split(":")
    assert config["auto_map"]["AutoModelForCausalLM"] == f"{module}.{cls}"
    assert config["model_type"] == manifest["name"] == "ocr_mini"
    model_tree = ast.parse((MODEL_DIR / f"{module}.py").read_text())
    classes = {n.name: n for n in model_tree.body if isinstance(n, ast.ClassDef)}
    assert {"generate", "__init__"} <= {f.name for f in classes[cls].body if isinstance(f, ast.FunctionDef)}
    assert manifest["run"] == {"method": "generate", "kwargs": {"max_new_tokens": 8}, "step": "forward_embeds"}
    step_fns = {f.name for f in classes[cls].body if isinstance(f, ast.FunctionDef)}
    assert manifest["run"]["step"] in step_fns
    for key in ("inputs", "decode"):
        mod, fn = manifest[key].split(":")
        funcs = {
            n.name
            for n in ast.parse((MODEL_DIR / f"{mod}.py").read_text()).body
            if isinstance(n, ast.FunctionDef)
        }
        assert fn in funcs
    assert set(manifest["shrink"]) <= set(config)

    vocab = json.loads((MODEL_DIR / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == config["vocab_size"] == len(set(vocab.values()))
    for token, key in [
        ("<pad>", "pad_token_id"),
        ("<s>", "bos_token_id"),
        ("</s>", "eos_token_id"),
        ("<image>", "image_token_id"),
    ]:
        assert vocab[token] == config[key]
    assert not list(MODEL_DIR.glob("*.safetensors")) and not list(MODEL_DIR.glob("*.bin")), (
        "weights are seeded, not shipped"
    )


# ---------------------------------------------------------------------------------------------
# Runtime: the hazard is real on a CPU-only host
# ---------------------------------------------------------------------------------------------


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        spec.loader.exec_module(module)
    finally:  # the model sets CUDA_VISIBLE_DEVICES on import; keep this process's env as it was
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    return module


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn is installed here")
def test_import_fails_on_a_cpu_only_host() -> None:
    with pytest.raises(ModuleNotFoundError) as err:
        _load("ocr_mini_original_modeling", MODELING)
    assert err.value.name == "flash_attn"


# ---------------------------------------------------------------------------------------------
# Runtime: a CPU copy ("cuda" -> "cpu", flash_attn faked) runs and is deterministic
# ---------------------------------------------------------------------------------------------


@dataclass
class CpuCopy:
    modeling: types.ModuleType
    samples: types.ModuleType
    config: dict[str, Any]
    flash_calls: list[int]

    def build(self, **overrides: Any) -> Any:  # an OcrMiniForCausalLM from the copied file
        torch.manual_seed(0)  # the harness seeds parameters; a fixed global seed is enough here
        return self.modeling.OcrMiniForCausalLM({**self.config, **overrides}).eval()

    def inputs(self, seed: int = 0) -> dict[str, torch.Tensor]:
        result: dict[str, torch.Tensor] = self.samples.make_inputs(self.config, seed)
        return result


def _fake_flash_attn(calls: list[int]) -> types.ModuleType:
    """Stand-in for the CUDA-only flash_attn: exact causal attention in its [b, s, h, d] layout."""

    def flash_attn_func(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float = 0.0,
        softmax_scale: float | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        calls.append(1)
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale
        )
        return out.transpose(1, 2)

    def flash_attn_varlen_func(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("the example never calls flash_attn_varlen_func")

    module = types.ModuleType("flash_attn")
    module.flash_attn_func = flash_attn_func  # type: ignore[attr-defined]
    module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
    return module


@pytest.fixture(scope="module")
def cpu_copy(tmp_path_factory: pytest.TempPathFactory) -> CpuCopy:
    root = tmp_path_factory.mktemp("ocr_mini_cpu") / "ocr_mini"
    shutil.copytree(MODEL_DIR, root)
    modeling = root / "modeling_ocr_mini.py"
    modeling.write_text(modeling.read_text().replace("cuda", "cpu"))
    calls: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "flash_attn", _fake_flash_attn(calls))
        module = _load("ocr_mini_cpu_modeling", modeling)
    samples = _load("ocr_mini_cpu_samples", root / "sample_inputs.py")
    config = json.loads((root / "config.json").read_text())
    return CpuCopy(module, samples, config, calls)


def test_cpu_copy_generates_deterministically(cpu_copy: CpuCopy) -> None:
    model = cpu_copy.build()
    inputs = cpu_copy.inputs()
    assert inputs["input_ids"].dtype == torch.long and inputs["input_ids"].shape[0] == 1
    assert inputs["pixel_values"].shape == (
        1,
        3,
        cpu_copy.config["image_size"],
        cpu_copy.config["image_size"],
    )
    n_image = int((inputs["input_ids"] == cpu_copy.config["image_token_id"]).sum())
    assert n_image == cpu_copy.config["num_queries"]

    first = model.generate(**inputs, max_new_tokens=8)
    second = model.generate(**inputs, max_new_tokens=8)
    assert first.shape == (1, 8) and first.dtype == torch.long
    assert torch.equal(first, second)
    assert int(first.min()) >= 0 and int(first.max()) < cpu_copy.config["vocab_size"]
    # (its speed is bench/port_time.py's business: a timed assertion failed on loaded machines)
    # Same seed, fresh construction: same tokens (weights depend only on the seed).
    assert torch.equal(cpu_copy.build().generate(**inputs, max_new_tokens=8), first)
    assert cpu_copy.flash_calls == [], "the fused flash path must be off by default"
    text = cpu_copy.samples.decode(cpu_copy.config, first[0].tolist())
    assert isinstance(text, str) and len(text) <= 8


def test_cpu_copy_sample_inputs_are_deterministic_per_seed(cpu_copy: CpuCopy) -> None:
    a, b, c = cpu_copy.inputs(0), cpu_copy.inputs(0), cpu_copy.inputs(1)
    assert torch.equal(a["pixel_values"], b["pixel_values"]) and torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["pixel_values"], c["pixel_values"])


def test_cpu_copy_image_features_reach_the_logits(cpu_copy: CpuCopy) -> None:
    model = cpu_copy.build()
    with torch.no_grad():
        logits_0 = model(**cpu_copy.inputs(0))
        logits_1 = model(**cpu_copy.inputs(1))
        text_only = model(cpu_copy.inputs(0)["input_ids"])
    assert logits_0.shape[-1] == cpu_copy.config["vocab_size"]
    assert (logits_0 - logits_1).abs().max() > 1e-2
    assert (logits_0 - text_only).abs().max() > 1e-2


def test_cpu_copy_attention_implementations_agree(cpu_copy: CpuCopy) -> None:
    inputs = cpu_copy.inputs()
    eager = cpu_copy.build().generate(**inputs)
    assert torch.equal(cpu_copy.build(_attn_implementation="sdpa").generate(**inputs), eager)
    before = len(cpu_copy.flash_calls)
    assert torch.equal(cpu_copy.build(use_flash_attn=True).generate(**inputs), eager)
    assert len(cpu_copy.flash_calls) > before
    with pytest.raises(ValueError, match="attention implementation"):
        cpu_copy.build(_attn_implementation="paged")


def test_cpu_copy_mixed_device_cat_is_a_latent_bug(
    cpu_copy: CpuCopy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On an Ascend host the device-check idiom gives "cpu" while the model sits on the NPU. Here the
    # model is on the CPU, so point the idiom's device elsewhere ("meta") to show the cat mixes them.
    monkeypatch.setattr(cpu_copy.modeling, "DEVICE", "meta")
    with pytest.raises(RuntimeError, match="device") as err:
        cpu_copy.build().generate(**cpu_copy.inputs())
    model_file = Path(str(cpu_copy.modeling.__file__))
    last_model_frame = [e for e in err.traceback if Path(e.path) == model_file][-1]
    assert "torch.cat" in str(last_model_frame.statement)


def test_cpu_copy_shrink_and_eos(cpu_copy: CpuCopy) -> None:
    shrink = yaml.safe_load((MODEL_DIR / "npuport.yaml").read_text())["shrink"]
    small = cpu_copy.build(**shrink)
    full = cpu_copy.build()
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in full.parameters())
    assert small.generate(**cpu_copy.inputs(), max_new_tokens=8).shape == (1, 8)

    tokens = full.generate(**cpu_copy.inputs(), max_new_tokens=8)
    stopped = full.generate(**cpu_copy.inputs(), max_new_tokens=8, eos_token_id=int(tokens[0, 0]))
    assert stopped.tolist() == [[int(tokens[0, 0])]]


def test_cpu_copy_rejects_a_prompt_without_enough_image_tokens(cpu_copy: CpuCopy) -> None:
    inputs = cpu_copy.inputs()
    ids = inputs["input_ids"].clone()
    ids[0, 1] = cpu_copy.config["bos_token_id"]  # drop one placeholder
    with pytest.raises(ValueError, match="image tokens"):
        cpu_copy.build().generate(ids, inputs["pixel_values"])
