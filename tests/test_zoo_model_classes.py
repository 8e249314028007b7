"""The zoo's harness, inputs and validation classes (issue 25): each test states a behaviour the code before
it did not have, on small synthetic models of the same shape as the zoo releases that showed the class
(an encoder without generate, an original that asserts a CUDA kernel at construction, a tokenizer whose
vocabulary file is missing but whose class builds the prompt's special tokens, a config that fetches a
sub-model's config from the Hub, a processor batch that goes through the model's own generate wrapper).
None of the fixtures is a real model's code."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.models import RunRecord
from agents.reading.entry import discover_entry
from sandbox.targets import Target
from tests.conftest import REPO_ROOT
from tests.test_remote_code import _harness, chat_folder_run

ENCODER = REPO_ROOT / "tests" / "fixtures" / "hf_encoder"


# ----------------------------------------------------------------------------------------------
# Encoders: validated on their forward outputs
# ----------------------------------------------------------------------------------------------

def test_an_encoder_without_generate_runs_forward_and_its_named_outputs_are_kept(tmp_path: Path) -> None:
    entry = discover_entry(ENCODER)
    # Before: a PreTrainedModel was always run with generate ("not compatible with .generate()").
    assert entry.run_method == "forward" and entry.run_kwargs == {}
    assert any("validated on its forward outputs" in a and "AutoModel" in a for a in entry.assumptions)
    res = _harness(ENCODER, entry.as_manifest_dict(), tmp_path, outputs_path=str(tmp_path / "outputs.pt"))
    assert res["ok"], res["exception"]
    out = res["outputs"]
    assert out["tokens"] is None and out["new_tokens"] == 0
    assert out["tensors"] == {"last_hidden_state": {"shape": [1, 8, 32], "dtype": "float32"},
                              "pooler_output": {"shape": [1, 32], "dtype": "float32"}}
    saved = torch.load(tmp_path / "outputs.pt", weights_only=True)
    assert list(saved) == ["last_hidden_state", "pooler_output"] and bool(torch.isfinite(saved["pooler_output"]).all())


def test_a_causal_lm_key_or_a_generation_hook_still_means_generate(tmp_path: Path) -> None:
    folder = tmp_path / "enc"
    import shutil

    shutil.copytree(ENCODER, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": config["auto_map"]["AutoConfig"],
                          "AutoModelForCausalLM": "modeling_tiny_encoder.TinyEncoderForMaskedLM"}
    (folder / "config.json").write_text(json.dumps(config))
    assert discover_entry(folder).run_method == "generate"  # the authors load it as a generator
    config["auto_map"] = {"AutoModel": "modeling_tiny_encoder.TinyEncoderModel"}
    (folder / "config.json").write_text(json.dumps(config))
    src = (folder / "modeling_tiny_encoder.py").read_text()
    (folder / "modeling_tiny_encoder.py").write_text(src.replace(
        "    def forward(self, input_ids, attention_mask=None, token_type_ids=None):",
        "    def prepare_inputs_for_generation(self, input_ids, **kwargs):\n        return {'input_ids': input_ids}\n\n"
        "    def forward(self, input_ids, attention_mask=None, token_type_ids=None):"))
    assert discover_entry(folder).run_method == "generate"  # it defines the hook transformers' generate calls


def _outputs_record(tmp_path: Path, name: str, tensors: dict[str, torch.Tensor]) -> RunRecord:
    run_dir = tmp_path / name
    run_dir.mkdir()
    torch.save(tensors, run_dir / "outputs.pt")
    meta = {k: {"shape": list(v.shape), "dtype": "float32"} for k, v in tensors.items()}
    return RunRecord(id=name, purpose="reference" if name.startswith("ref") else "port", target="cpu", ok=True,
                     status="ok", wall_s=1.0, result_path=str(run_dir / "result.json"), tokens=None,
                     output_tensors=meta)


def test_forward_outputs_are_compared_within_the_port_dtypes_tolerance(tmp_path: Path) -> None:
    from agents.validation.compare import compare_outputs, compared_outputs, self_disagreement

    g = torch.Generator().manual_seed(0)
    hidden, pooled = torch.randn(1, 8, 32, generator=g), torch.randn(1, 32, generator=g)
    ref = _outputs_record(tmp_path, "ref", {"last_hidden_state": hidden, "pooler_output": pooled})
    same = _outputs_record(tmp_path, "port-same", {"last_hidden_state": hidden + 1e-7, "pooler_output": pooled})
    assert compared_outputs(same, ref)
    ok = compare_outputs(same, ref, "float32")
    assert ok.verdict == "match" and ok.compared == "outputs"
    assert "last_hidden_state (1, 8, 32): cosine 1.000000" in ok.detail and "cosine >= 0.99999" in ok.detail
    assert set(ok.metrics["outputs"]) == {"last_hidden_state", "pooler_output"}
    # a bfloat16 port's rounding passes bfloat16's tolerance, not float32's
    rounded = _outputs_record(tmp_path, "port-half", {"last_hidden_state": hidden.bfloat16().float(),
                                                     "pooler_output": pooled.bfloat16().float()})
    assert compare_outputs(rounded, ref, "bfloat16").verdict == "match"
    assert compare_outputs(rounded, ref, "float32").verdict == "mismatch"
    # a wrong pooler is named; a missing output and a wrong shape too
    wrong = _outputs_record(tmp_path, "port-wrong", {"last_hidden_state": hidden, "pooler_output": -pooled})
    bad = compare_outputs(wrong, ref, "float32")
    assert bad.verdict == "mismatch" and "beyond the float32 tolerance" in bad.detail and "pooler_output" in bad.detail
    short = _outputs_record(tmp_path, "port-short", {"last_hidden_state": hidden[:, :4]})
    detail = compare_outputs(short, ref).detail
    assert "last_hidden_state (shape (1, 4, 32), the original's (1, 8, 32))" in detail
    assert "pooler_output (the port returned none)" in detail
    # two runs of the original that disagree on their outputs are the verdict, not the port's fault
    again = _outputs_record(tmp_path, "ref-2", {"last_hidden_state": hidden * 2, "pooler_output": pooled})
    verdict = self_disagreement(ref, again)
    assert verdict is not None and verdict.verdict == "nondeterministic-reference" and verdict.compared == "outputs"
    assert self_disagreement(ref, _outputs_record(tmp_path, "ref-3", {"last_hidden_state": hidden,
                                                                      "pooler_output": pooled})) is None


def test_the_report_says_an_encoder_was_validated_on_its_outputs() -> None:
    from agents.report.bundle import final_status
    from agents.report.markdown import _validation

    numerics = {"verdict": "match", "compared": "outputs", "detail": "forward outputs ... equal",
                "metrics": {"dtype": "float16", "tolerance": {"min_cosine": 0.999, "max_share_over_1e3": 0.5}}}
    status, reason = final_status({"numerics": numerics})
    assert status == "validated" and "forward outputs match the original's within the float16 tolerance" in reason
    text = "\n".join(_validation({"numerics": numerics}))
    assert "the forward outputs (the model has no generate)" in text and "cosine >= 0.999" in text
    assert "reference tokens" not in text


# ----------------------------------------------------------------------------------------------
# The reference: an original that cannot be built without CUDA
# ----------------------------------------------------------------------------------------------

# The end every toy model of this file shares: a greedy generate and its inputs function.
TOY_TAIL = """
    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self(ids)[:, -1:].argmax(-1)], dim=1)
        return ids


def make_inputs(config, seed):
    return {"input_ids": torch.tensor([[1, 2, 3]])}
"""


def _toy_folder(folder: Path, code: str, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    (folder / "modeling_toy.py").write_text(code)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "npuport.yaml").write_text(f"name: {folder.name}\nentry: {{class: 'modeling_toy:Toy'}}\n"
                                         "inputs: 'modeling_toy:make_inputs'\nrun: {method: generate, kwargs: "
                                         "{max_new_tokens: 4}}\n")
    return folder


FLASH_ASSERT = textwrap.dedent('''
    import torch
    from torch import nn

    try:
        from flash_attn.flash_attn_interface import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None


    class FlashCore(nn.Module):
        def __init__(self):
            super().__init__()
            assert flash_attn_varlen_func is not None, "Please install FlashAttention first"

        def forward(self, q):
            return flash_attn_varlen_func(q)


    class Toy(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.emb = nn.Embedding(config["vocab_size"], 16)
            self.flash = FlashCore()
            self.use_flash = config.get("use_flash_attn", False)
            self.head = nn.Linear(16, config["vocab_size"])

        def forward(self, input_ids):
            return self.head(torch.tanh(self.emb(input_ids)))

''') + TOY_TAIL


def _flash_assert_model(tmp_path: Path) -> Path:
    return _toy_folder(tmp_path / "flashy", FLASH_ASSERT, {"vocab_size": 32, "use_flash_attn": True})


def test_an_original_that_asserts_a_cuda_kernel_at_construction_gets_the_switch_only_fix_and_says_so(
        tmp_path: Path) -> None:
    from agents.validation.compare import reference_run
    from agents.workspace import Workspace

    folder = _flash_assert_model(tmp_path)
    ws = Workspace.create(folder, tmp_path / "ws")
    state: dict[str, Any] = {"workdir": str(ws.root), "entry": discover_entry(folder).as_manifest_dict(),
                             "request": {"model_path": str(folder)}}
    rec, runs = reference_run(state)
    # Before: the reference failed with the original's own AssertionError, so nothing could be validated.
    assert rec.ok and runs == 2, rec.exception
    assert rec.tokens is not None and len(rec.tokens[0]) == 7
    [note] = rec.reference_adjusted or []
    assert note.startswith("reference adjusted: modeling_toy.py line 14: construction no longer requires the "
                           "CUDA-only kernel")
    assert "AssertionError: Please install FlashAttention first at modeling_toy.py:14" in note
    assert "assert flash_attn_varlen_func is not None" in (folder / "modeling_toy.py").read_text()  # user's untouched
    assert "assert flash_attn_varlen_func" not in (ws.root / "original" / "modeling_toy.py").read_text()
    again, runs2 = reference_run(state, "reference-2")  # adjusted once: later runs start from the adjusted copy
    assert again.ok and runs2 == 1 and again.reference_adjusted == rec.reference_adjusted


def test_an_original_that_builds_as_written_is_never_adjusted(tmp_path: Path) -> None:
    from agents.validation.reference import adjust_tree

    folder = _flash_assert_model(tmp_path)
    src = "\n".join(line for line in (folder / "modeling_toy.py").read_text().splitlines()
                    if "assert flash_attn_varlen_func" not in line) + "\n"
    (folder / "modeling_toy.py").write_text(src)
    assert adjust_tree(folder) == []
    assert (folder / "modeling_toy.py").read_text() == src


# ----------------------------------------------------------------------------------------------
# A stand-in tokenizer keeps the special-token structure the model's own tokenizer class builds
# ----------------------------------------------------------------------------------------------

OWN_TOKENIZER = textwrap.dedent('''
    from transformers import PreTrainedTokenizer


    class GlmLikeTokenizer(PreTrainedTokenizer):
        """Its vocabulary file (an LFS blob) is not in the folder, so it cannot be built here."""

        def __init__(self, vocab_file, gmask_token="[gMASK]", bos_token="<sop>", eos_token="<eop>",
                     add_bos=True, **kwargs):
            self.sp_tokenizer = open(vocab_file).read()  # fails: the file is missing
            super().__init__(bos_token=bos_token, eos_token=eos_token, **kwargs)

        def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
            gmask_id = self.sp_tokenizer[self.gmask_token]
            suffix = [gmask_id, self.sp_tokenizer[self.bos_token]] if self.add_bos else [gmask_id]
            return token_ids_0 + suffix
''')


def _glm_like(tmp_path: Path) -> Path:
    folder = tmp_path / "glm"
    folder.mkdir()
    (folder / "tokenization_glm.py").write_text(OWN_TOKENIZER)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GlmLikeTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_glm.GlmLikeTokenizer", None]},
        "vocab_file": "ice_text.model", "gmask_token": "[gMASK]", "bos_token": "<sop>", "eos_token": "<eop>",
        "mask_token": "[MASK]"}))
    (folder / "config.json").write_text(json.dumps({"vocab_size": 500, "gmask_token_id": 430, "mask_token_id": 429,
                                                    "bos_token_id": 431, "eos_token_id": 432, "pad_token_id": 3}))
    return folder


def test_a_stand_in_tokenizer_gives_the_prompt_the_special_tokens_the_models_own_class_adds(tmp_path: Path) -> None:
    from sandbox.inputs.stand_in_tokenizer import load_tokenizer

    folder = _glm_like(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    tok, how = load_tokenizer(folder, config)
    assert "a stand-in tokenizer (the folder's tokenizer does not load here" in how
    assert "GlmLikeTokenizer.build_inputs_with_special_tokens adds" in how
    ids = tok(["Read the text."], return_tensors="pt")["input_ids"][0].tolist()
    # Before: character ids only, and `<sop>` got a character-hash id: the model's code looks for 430 and 431.
    assert ids[-2:] == [430, 431] and all(i < 429 for i in ids[:-2])
    assert tok.convert_tokens_to_ids("[MASK]") == 429 and tok.eos_token_id == 432
    assert tok("[gMASK] x", add_special_tokens=False)["input_ids"][0] == 430  # one token, the config's id


# ----------------------------------------------------------------------------------------------
# Sub-model configs fetched from the Hub at construction: built offline
# ----------------------------------------------------------------------------------------------

def test_a_hub_id_names_its_model_type() -> None:
    from sandbox.harness.hub_offline import model_type_of

    types = ["llama", "llama4", "mllama", "whisper", "qwen2", "qwen2_vl", "phi", "phi3", "t5", "mt5"]
    assert model_type_of("meta-llama/Llama-3.1-8B-Instruct", types) == "llama"
    assert model_type_of("openai/whisper-large-v3-turbo", types) == "whisper"
    assert model_type_of("Qwen/Qwen2.5-7B-Instruct", types) == "qwen2"
    assert model_type_of("Qwen/Qwen2-VL-7B", types) == "qwen2_vl"
    assert model_type_of("microsoft/phi-2", types) == "phi"
    assert model_type_of("google/flan-t5-small", types) == "t5"
    assert model_type_of("someone/unknown-model", types) is None


def test_a_config_that_fetches_a_sub_config_from_the_hub_is_built_offline_and_shrunk(tmp_path: Path) -> None:
    """In a subprocess: install() patches transformers for the rest of the interpreter's life."""
    import subprocess
    import sys

    script = textwrap.dedent(f'''
        import json, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from pathlib import Path
        from transformers import AutoConfig, PretrainedConfig
        from sandbox.harness.hub_offline import install

        class Composite(PretrainedConfig):
            def __init__(self, text_model_id=None, vocab_size=None, **kw):
                self.text_config = AutoConfig.from_pretrained(text_model_id) if text_model_id else None
                super().__init__(**kw)

        parent = {{"text_model_id": "meta-llama/Llama-3.1-8B-Instruct", "vocab_size": 128256}}
        state = install(Path({str(tmp_path)!r}), parent, shrink=True)
        c = Composite(**parent)
        t = c.text_config
        print(json.dumps({{"cls": type(t).__name__, "vocab": t.vocab_size, "hidden": t.hidden_size,
                          "layers": t.num_hidden_layers, "heads": t.num_attention_heads, "notes": state.notes}}))
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # Before: OSError (no network), the model could not even be configured.
    assert got["cls"] == "LlamaConfig" and got["vocab"] == 128256  # the ids the model's inputs use
    assert got["layers"] == 2 and got["heads"] == 4 and got["hidden"] < 4096  # shrunk like config.json
    [note] = got["notes"]
    assert note.startswith("meta-llama/Llama-3.1-8B-Instruct: a Hub id the model's code fetches at construction")
    assert "LlamaConfig (model type 'llama', named in the id)" in note and "vocab_size 128256 from config.json" in note


def test_weights_left_on_the_meta_device_are_materialised_and_seeded_deterministically() -> None:
    from torch import nn

    from sandbox.inputs.model_inputs import seed_parameters

    def build() -> nn.Module:
        m = nn.Module()
        m.tower = nn.Linear(4, 4, device="meta")  # init_empty_weights: its checkpoint would fill it
        m.head = nn.Linear(4, 2)
        torch.manual_seed(0)
        m.head.reset_parameters()
        return m

    a, b = build(), build()
    assert seed_parameters(a, 0) == ["tower: 2 tensor(s)"]
    seed_parameters(b, 0)
    assert not a.tower.weight.is_meta and bool(torch.isfinite(a.tower.weight).all())
    assert torch.equal(a.tower.weight, b.tower.weight) and float(a.tower.weight.std()) > 0


# ----------------------------------------------------------------------------------------------
# A processor's batch through the model's own generate wrapper
# ----------------------------------------------------------------------------------------------

class _Generator:
    def generate(self, inputs: Any = None, generation_config: Any = None, **kwargs: Any) -> Any:
        raise AssertionError("the real generate must not run while inputs are captured")


class _BatchModel(_Generator):
    """generate_from_batch derives masks and positions from the processor's batch, then super().generate."""

    def parameters(self) -> Any:
        return iter([torch.zeros(1)])

    def forward(self, **kwargs: Any) -> Any:
        raise AssertionError("forward must not run either")

    def generate_from_batch(self, batch: dict[str, Any], generation_config: Any = None, **kwargs: Any) -> Any:
        ids = batch["input_ids"]
        n = generation_config.max_new_tokens
        mask = torch.cat([ids != -1, torch.ones(ids.shape[0], n, dtype=torch.bool)], dim=1)
        positions = torch.cumsum((ids != -1).int(), dim=-1) - 1
        return super().generate(ids, generation_config, attention_mask=mask, position_ids=positions,
                                images=batch["images"], **kwargs)


def test_a_processor_batch_goes_through_the_models_own_generate_wrapper() -> None:
    from sandbox.inputs.processor_inputs import _through_wrapper, generate_wrapper

    model = _BatchModel()
    assert generate_wrapper(model) == "generate_from_batch"
    batch = {"input_ids": torch.tensor([[5, 6, 7]]), "images": torch.ones(1, 2, 4)}
    inputs, kwargs = _through_wrapper(model, "generate_from_batch", batch, None, max_new_tokens=5)
    # Before: the batch went to generate as it was; the wrapper's masks and positions were never built.
    assert set(inputs) == {"input_ids", "attention_mask", "position_ids", "images"}
    assert inputs["attention_mask"].shape == (1, 8) and inputs["position_ids"].tolist() == [[0, 1, 2]]
    assert kwargs == {}  # the generation config is npuport's to set (greedy, N tokens)
    assert "generate" not in vars(model) and _Generator.generate.__name__ == "generate"  # restored


def test_remote_code_loaded_by_transformers_is_the_releases_own_not_the_library() -> None:
    """transformers' loader imports a release's processor as ``transformers_modules.<folder>.<file>``: its
    ``process()`` (a processor with no __call__) and a model's ``generate_from_batch`` are the release's own,
    not transformers' (a 'MolmoProcessor object is not callable' came from reading them as the library's)."""
    from sandbox.inputs.processor_inputs import _own_names, generate_wrapper

    class Processor:
        def process(self, text, images=None):
            return {"input_ids": text}

    class Remote:
        def generate_from_batch(self, batch, generation_config=None):
            return batch

    Processor.__module__ = Remote.__module__ = "transformers_modules.local.preprocessing_release"
    assert "process" in _own_names(Processor()) and "__call__" not in _own_names(Processor())
    assert generate_wrapper(Remote()) == "generate_from_batch"

    class Library:
        def process(self):
            return None

    Library.__module__ = "transformers.processing_utils"
    assert "process" not in _own_names(Library())


# ----------------------------------------------------------------------------------------------
# A CUDA device named in config.json (the code reads it, so rewriting the code's literals changes nothing)
# ----------------------------------------------------------------------------------------------

@pytest.mark.meaning("config-device")
def test_a_cuda_device_in_config_json_is_a_finding_fixed_with_the_ports_device(tmp_path: Path) -> None:
    from agents.fixing.commits import apply_fix
    from agents.policies.rule import RulePolicy
    from agents.reading.scanner import scan_tree
    from agents.workspace import Workspace

    folder = tmp_path / "vlm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8, "device": "cuda",
                                                    "vision": {"device": "cuda:0", "width": 4}}, indent=2))
    (folder / "modeling_x.py").write_text("import torch\n\n\nclass M(torch.nn.Module):\n    def __init__(self, "
                                          "config):\n        super().__init__()\n        self.w = "
                                          "torch.zeros(2).to(config.device)\n")
    found = [f for f in scan_tree(folder).findings if f.rule == "cuda-device-in-config"]
    # Before: no finding, so the only fix tried was the code's (device-agnostic), which changed nothing.
    assert [(f.file, f.line) for f in found] == [("config.json", 3), ("config.json", 5)]
    actions = [a for a in RulePolicy().plan_fixes(found) if a.codemod == "config-device"]
    assert len(actions) == 1 and actions[0].files == ["config.json"]
    ws = Workspace.create(folder, tmp_path / "ws")
    patch, _ = apply_fix(ws, actions[0], 1, target=Target("x", "npu:0"))
    assert patch is not None and patch.files == ["config.json"]
    config = json.loads((ws.model_dir / "config.json").read_text())
    assert config["device"] == "npu" and config["vision"] == {"device": "npu", "width": 4}
    assert patch.edits[0] == ('config.json line 3: device: "cuda" -> "npu" (the port\'s device; the model\'s code '
                              'reads this value)')
    assert json.loads((folder / "config.json").read_text())["device"] == "cuda"  # the user's folder untouched
    # meaning: the rewritten config is the original with only its device values moved to the port's device
    original = json.loads((folder / "config.json").read_text())
    moved = json.loads(json.dumps(original).replace('"cuda:0"', '"npu"').replace('"cuda"', '"npu"'))
    assert config == moved


# ----------------------------------------------------------------------------------------------
# A module the model imports under try/except ImportError keeps its CUDA-only imports
# ----------------------------------------------------------------------------------------------

def test_a_cuda_only_import_in_a_module_the_model_treats_as_optional_is_not_guarded(tmp_path: Path) -> None:
    from agents.reading.scanner import scan_tree

    folder = tmp_path / "enc"
    (folder / "kernels").mkdir(parents=True)
    (folder / "kernels" / "__init__.py").write_text("")
    (folder / "kernels" / "flash_triton.py").write_text(
        "import torch\nimport triton\n\n\ndef flash(q):\n    assert q.is_cuda\n    return triton.cdiv(q, 2)\n")
    (folder / "layers.py").write_text(
        "import torch\n\ntry:\n    from .kernels.flash_triton import flash\nexcept ImportError:\n    flash = None\n")
    (folder / "other.py").write_text("import torch\nimport triton\n\n\ndef f(x):\n    return triton.cdiv(x, 2)\n")
    found = {(f.file, f.rule): f for f in scan_tree(folder).findings if f.hazard == "H3"}
    optional = found[("kernels/flash_triton.py", "cuda-only-import")]
    # Before: guarded like any other, so the module imported and the model took the Triton path on Ascend.
    assert not optional.fixable and "(layers.py:4)" in optional.message
    assert "switch to its torch path" in optional.message
    assert found[("other.py", "cuda-only-import")].fixable  # a module nothing guards is still guarded


# ----------------------------------------------------------------------------------------------
# A model whose own chat reads self.tokenizer and generates through its language model
# ----------------------------------------------------------------------------------------------

WRAPPER_VLM = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyLM(nn.Module):
        def __init__(self, vocab, width):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, width)
            self.head = nn.Linear(width, vocab)

        def generate(self, inputs_embeds=None, max_new_tokens=4, do_sample=False, **kwargs):
            out, h = [], inputs_embeds
            for _ in range(max_new_tokens):
                nxt = self.head(h.mean(1)).argmax(-1)
                out.append(nxt)
                h = torch.cat([h, self.embed_tokens(nxt)[:, None]], dim=1)
            return torch.stack(out, dim=1)


    class Composer(nn.Module):
        """As an InternLM-XComposer-style release: the user sets model.tokenizer, chat(text, image) encodes
        both with the model's own code and generates through the language model."""

        def __init__(self, config):
            super().__init__()
            self.lm = TinyLM(config["vocab_size"], 16)
            self.vision = nn.Linear(3, 16)
            self.tokenizer = None

        def encode_img(self, image):
            from PIL import Image
            import numpy as np
            pixels = torch.tensor(np.asarray(Image.open(image).convert("RGB"), dtype="float32")[:4, :4] / 255.0)
            return self.vision(pixels.reshape(1, 16, 3))

        def chat(self, text, image=None, history=None, **kwargs):
            ids = self.tokenizer(text, return_tensors="pt").input_ids
            embeds = torch.cat([self.encode_img(image), self.lm.embed_tokens(ids)], dim=1)
            out = self.lm.generate(inputs_embeds=embeds, max_new_tokens=kwargs.get("max_new_tokens", 32))
            return self.tokenizer.decode(out[0]), history

        def forward(self, input_ids):
            return self.lm.head(self.lm.embed_tokens(input_ids))
''')


def test_a_chat_that_reads_self_tokenizer_and_generates_through_its_language_model_is_driven(tmp_path: Path) -> None:
    # Before: chat takes no tokenizer argument, so no preprocessing path was found and inputs were synthesised
    # for Composer.forward; the model's own text-and-image path never ran.
    entry, res = chat_folder_run(tmp_path, "composer", WRAPPER_VLM)
    assert any("model.tokenizer set, which it reads" in a for a in entry.assumptions)
    assert res["ok"], res["exception"]
    assert res["inputs"]["source"] == "preprocess" and res["inputs"]["method"] == "lm.generate"
    notes = " ".join(res["inputs"]["notes"])
    assert "set as model.tokenizer" in notes and "its lm.generate call was intercepted: inputs_embeds (1, " in notes
    assert "generates through its submodule lm (TinyLM)" in notes
    assert len(res["outputs"]["tokens"][0]) == 4  # the language model's greedy ids, not the chat's text


# ----------------------------------------------------------------------------------------------
# FlashAttention selected in config.json (a vision sub-config), and a table of attention functions
# without "sdpa"
# ----------------------------------------------------------------------------------------------

ATTN_TABLE = textwrap.dedent('''
    import torch
    from torch import nn


    def flash_attention(q):
        from flash_attn import flash_attn_varlen_func  # CUDA only
        return flash_attn_varlen_func(q)


    def eager_attention(q):
        return torch.softmax(q @ q.transpose(-1, -2), -1) @ q


    ATTENTION_FUNCTIONS = {
        "flash_attention_2": flash_attention,
        "eager": eager_attention,
    }


    class Tower(nn.Module):
        def __init__(self, width, attn_implementation="flash_attention_2"):
            super().__init__()
            if attn_implementation == "flash_attention_2":
                import flash_attn  # noqa: F401  (what transformers checks when the config asks for it)
            self.attn = ATTENTION_FUNCTIONS[attn_implementation]
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            return self.proj(self.attn(x))


    class Toy(nn.Module):
        def __init__(self, config):
            super().__init__()
            vision = config["vision_config"]
            self.emb = nn.Embedding(config["vocab_size"], 16)
            self.tower = Tower(16, vision["_attn_implementation"])
            self.head = nn.Linear(16, config["vocab_size"])

        def forward(self, input_ids):
            return self.head(self.tower(torch.tanh(self.emb(input_ids))))

''') + TOY_TAIL


def _attn_table_model(tmp_path: Path, table: str = ATTN_TABLE) -> Path:
    return _toy_folder(tmp_path / "tower", table, {"vocab_size": 32, "vision_config": {
        "_attn_implementation": "flash_attention_2", "width": 16}})


@pytest.mark.meaning("config-attn-impl")
def test_flash_attention_in_config_json_becomes_what_the_models_table_has(tmp_path: Path) -> None:
    """config.json's ``"_attn_implementation": "flash_attention_2"`` (here a vision sub-config's) overrides the
    code's default, so rewriting the code alone left transformers refusing to build the model ("FlashAttention2
    has been toggled on, but it cannot be used"). And the model's own table of attention functions has no
    "sdpa": the "sdpa" the code's default became was a KeyError. One choice for the whole model: "eager"
    where a table lacks "sdpa", "sdpa" otherwise, in config.json and in the code alike."""
    from agents.fixing.commits import apply_fix
    from agents.policies.rule import RulePolicy
    from agents.reading.scanner import scan_tree
    from agents.workspace import Workspace

    folder = _attn_table_model(tmp_path)
    findings = scan_tree(folder).findings
    rules = {(f.rule, f.file, f.line) for f in findings if "flash-attention" in f.rule}
    assert ("flash-attention-config", "config.json", 4) in rules
    assert ("flash-attention-table-no-sdpa", "modeling_toy.py", 16) in rules
    plan = {a.codemod: a for a in RulePolicy().plan_fixes(findings)}
    assert plan["config-attn-impl"].params == {"impl": "eager"} == plan["attn-impl-sdpa"].params
    ws = Workspace.create(folder, tmp_path / "ws")
    patch, _ = apply_fix(ws, plan["config-attn-impl"], 1)
    assert patch is not None and patch.files == ["config.json"]
    config = json.loads((ws.model_dir / "config.json").read_text())
    assert config == {"vocab_size": 32, "vision_config": {"_attn_implementation": "eager", "width": 16}}
    patch, _ = apply_fix(ws, plan["attn-impl-sdpa"], 2)
    assert patch is not None and 'attn_implementation="eager"' in (ws.model_dir / "modeling_toy.py").read_text()
    assert "flash_attention_2" in (folder / "config.json").read_text()  # the user's folder untouched

    # A table that has "sdpa": the choice is sdpa.
    with_sdpa = ATTN_TABLE.replace('    "eager": eager_attention,\n', '    "eager": eager_attention,\n'
                                   '    "sdpa": eager_attention,\n')
    other = _attn_table_model(tmp_path / "b", with_sdpa)
    findings = scan_tree(other).findings
    assert not [f for f in findings if f.rule == "flash-attention-table-no-sdpa"]
    plan = {a.codemod: a for a in RulePolicy().plan_fixes(findings)}
    assert plan["config-attn-impl"].params == {"impl": "sdpa"}


def test_an_original_that_selects_flash_attention_in_config_json_gets_eager_in_its_reference(tmp_path: Path) -> None:
    """The original as written cannot be built without flash_attn, so nothing could be validated against it.
    Its reference copy gets the switch to "eager" in config.json and in the code (the same attention), the
    report lists each edit, and the deployment's Transformers side builds from that same copy."""
    from agents.deploy.serving import reference_model_dir
    from agents.validation.compare import reference_run
    from agents.workspace import Workspace

    folder = _attn_table_model(tmp_path)
    ws = Workspace.create(folder, tmp_path / "ws")
    state: dict[str, Any] = {"workdir": str(ws.root), "entry": discover_entry(folder).as_manifest_dict(),
                             "request": {"model_path": str(folder)}}
    rec, runs = reference_run(state)
    assert rec.ok and runs == 2, rec.exception
    notes = rec.reference_adjusted or []
    assert any(n.startswith('reference adjusted: config.json line 4: vision_config._attn_implementation: '
                            '"flash_attention_2" -> "eager"') for n in notes), notes
    assert len(notes) == 2 and all("StubCalled: flash_attn.flash_attn_varlen_func was called" in n for n in notes)
    adjusted = json.loads((ws.root / "original" / "config.json").read_text())
    assert adjusted["vision_config"]["_attn_implementation"] == "eager"
    assert json.loads((folder / "config.json").read_text())["vision_config"]["_attn_implementation"] == \
        "flash_attention_2"  # the user's folder untouched
    # The deployment's reference: the adjusted copy once validation needed it, the original otherwise.
    assert reference_model_dir({**state, "runs": [rec.model_dump()]}, folder) == (ws.root / "original").resolve()
    plain = rec.model_copy(update={"reference_adjusted": None}).model_dump()
    assert reference_model_dir({**state, "runs": [plain]}, folder) == folder
    gone = {**state, "workdir": str(tmp_path / "gone"), "runs": [rec.model_dump()]}  # a report read elsewhere
    assert reference_model_dir(gone, folder) == folder
