"""HF remote-code models as transformers loads them, --shrink, and the one environment.

The fixture tests/fixtures/hf_remote_pkg is a small synthetic model of the same SHAPE as an
image-to-text remote-code release (relative imports between its modules, config.json auto_map with
an AutoConfig, a PretrainedConfig subclass with nested sub-configs, a routed-expert decoder, images as
a list of (crops, global view) tuples, a custom generate, an infer-style method taking a tokenizer);
it is not any real model's code. Harness runs go through real subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.reading.entry import discover_entry
from api.cli_port import EXIT_NOT_VERIFIED
from sandbox.harness.shrink import estimate_params, shrink_config
from tests.conftest import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "hf_remote_pkg"


def _harness(model: Path, manifest: dict, tmp_path: Path, **spec: object) -> dict:  # type: ignore[type-arg]
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    run_dir.mkdir()
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps({"model_dir": str(model), "manifest": manifest, "device": "cpu", "seed": 0,
                                     "result_path": str(run_dir / "result.json"), **spec}))
    # -I as the sandbox runs it: the model's folder is not on the path unless the harness puts it there.
    subprocess.run([sys.executable, "-I", "-B", "-m", "sandbox.harness.worker", str(spec_path)], cwd=run_dir,
                   capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    return json.loads((run_dir / "result.json").read_text())


def chat_folder_run(tmp_path: Path, name: str, modeling: str) -> tuple[Any, dict]:  # type: ignore[type-arg]
    """A one-file model folder (config: vocab 64, image 8; a tokenizer_config, no tokenizer) whose entry is
    discovered and whose discovered chat is run by the harness for 4 new tokens: (the entry, the result)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / f"modeling_{name}.py").write_text(modeling)
    (folder / "config.json").write_text(json.dumps({"vocab_size": 64, "image_size": 8}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    entry = discover_entry(folder)
    assert entry.run_preprocess == "chat", entry.assumptions
    manifest = {**entry.as_manifest_dict(), "run": {"method": "generate", "preprocess": "chat",
                                                   "kwargs": {"max_new_tokens": 4}}}
    return entry, _harness(folder, manifest, tmp_path)


# ----------------------------------------------------------------------------------------------
# Shrink
# ----------------------------------------------------------------------------------------------

def test_shrink_derives_consistent_small_sizes_at_every_nesting_level() -> None:
    config = json.loads((FIXTURE / "config.json").read_text())
    small, changes = shrink_config(config)
    lang, vision = small["language_config"], small["vision_config"]
    # Four heads of the original per-head size (256 / 8 = 32): code derives head counts and rotary sizes
    # from the head size, so it is kept.
    assert (lang["num_hidden_layers"], lang["hidden_size"], lang["num_attention_heads"]) == (2, 128, 4)
    assert lang["hidden_size"] % lang["num_attention_heads"] == 0
    assert lang["num_attention_heads"] % lang["num_key_value_heads"] == 0
    assert (lang["n_routed_experts"], lang["num_experts_per_tok"], lang["n_shared_experts"]) == (4, 2, 1)
    assert lang["first_k_dense_replace"] < lang["num_hidden_layers"]
    assert (vision["width"], vision["layers"], vision["heads"]) == (128, 2, 4)  # 4 heads of 32 already
    # Kept: the vocabulary and the image size (preprocessed inputs must stay valid).
    assert lang["vocab_size"] == 300 and vision["image_size"] == 16
    assert "language_config.num_hidden_layers: 6 -> 2" in changes
    assert "language_config.hidden_size: 256 -> 128" in changes
    assert not any(c.startswith("vision_config.width") for c in changes)
    assert not any("vocab_size" in c or "image_size" in c for c in changes)
    assert config["language_config"]["hidden_size"] == 256, "the input config is not modified"


def test_shrink_keeps_the_attention_grouping_class_and_applies_overrides_last() -> None:
    gqa, _ = shrink_config({"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096})
    mqa, _ = shrink_config({"num_attention_heads": 32, "num_key_value_heads": 1, "hidden_size": 4096})
    assert (gqa["num_attention_heads"], gqa["num_key_value_heads"]) == (4, 2)
    assert mqa["num_key_value_heads"] == 1
    small, changes = shrink_config({"vision_config": {"width": 1024}, "hidden_size": 2048},
                                   {"vision_config.width": 128, "projector_dim": 7})
    assert small["vision_config"]["width"] == 128 and small["projector_dim"] == 7
    assert "vision_config.width: 1024 -> 128 (manifest shrink override)" in changes
    assert not any(c.startswith("vision_config.width: 1024 -> 64") for c in changes)


def test_too_large_a_config_is_refused_naming_the_flag(tmp_path: Path) -> None:
    big = {"auto_map": {"AutoModel": "modeling_mmocr.MmOcrForCausalLM"},
           "language_config": {"hidden_size": 16384, "num_hidden_layers": 400, "intermediate_size": 65536,
                               "vocab_size": 256000}}
    assert estimate_params(big) > 10**12
    model = tmp_path / "model"
    shutil.copytree(FIXTURE, model)
    (model / "config.json").write_text(json.dumps(big))
    manifest = discover_entry(model).as_manifest_dict()
    res = _harness(model, manifest, tmp_path)
    assert not res["ok"] and res["exception"]["type"] == "MemoryError"
    assert "--shrink" in res["exception"]["message"]


# ----------------------------------------------------------------------------------------------
# Loading as transformers does
# ----------------------------------------------------------------------------------------------

def test_entry_for_remote_code_uses_auto_map_and_the_inputs_hook() -> None:
    entry = discover_entry(FIXTURE)
    assert entry.kind == "auto_map" and entry.class_name == "MmOcrForCausalLM"
    assert entry.inputs_fn == "npuport_inputs:make_inputs"
    assert entry.run_method == "generate" and entry.run_kwargs == {"max_new_tokens": 8}
    assert any("AutoConfig" in a for a in entry.assumptions)


def test_harness_imports_the_folder_as_a_package_and_builds_through_auto_config(tmp_path: Path) -> None:
    manifest = discover_entry(FIXTURE).as_manifest_dict()
    res = _harness(FIXTURE, manifest, tmp_path, shrink=True)
    assert res["ok"], res["exception"]
    tokens = res["outputs"]["tokens"]
    assert len(tokens) == 1 and len(tokens[0]) == 8  # greedy generation of N new tokens, not one forward
    assert "language_config.hidden_size: 256 -> 128" in res["shrunk"]
    again = _harness(FIXTURE, manifest, tmp_path, shrink=True)
    assert again["outputs"]["tokens"] == tokens  # random weights with a fixed seed
    # The class refuses a plain dict: building it as cls(dict) would fail here.
    bad = {**manifest, "entry": {"class": "modeling_mmocr:MmOcrForCausalLM"}}
    assert _harness(FIXTURE, bad, tmp_path, shrink=True)["ok"]


def test_nested_inputs_move_to_the_device() -> None:
    import torch

    from sandbox.harness.feeding import to_device as _to_device

    t = torch.ones(2)
    moved = _to_device({"images": [(t, t)], "meta": {"mask": t}, "n": 3}, "meta")
    assert moved["images"][0][1].device.type == "meta" and isinstance(moved["images"][0], tuple)
    assert moved["meta"]["mask"].device.type == "meta" and moved["n"] == 3


def test_without_an_inputs_function_inputs_are_synthesised_from_the_signature(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(FIXTURE, model)
    (model / "npuport_inputs.py").unlink()
    entry = discover_entry(model)
    assert entry.inputs_fn is None and any("synthesised" in a for a in entry.assumptions)
    res = _harness(model, entry.as_manifest_dict(), tmp_path, shrink=True)
    assert res["ok"], res["exception"]
    assert all(0 <= t < 300 for t in res["outputs"]["tokens"][0])


TILED = REPO_ROOT / "tests" / "fixtures" / "hf_remote_tiled"


def test_shrink_keeps_a_width_the_code_hard_codes_and_says_where() -> None:
    from sandbox.harness.shrink import hard_coded_widths

    config = json.loads((TILED / "config.json").read_text())
    small, changes = shrink_config(config, {}, TILED)
    # The projector's output width is the literal 96 in the code: shrinking hidden_size would break it.
    assert small["hidden_size"] == 96 and small["num_hidden_layers"] == 2
    assert small["num_attention_heads"] == 6  # the width kept, its heads too: the per-head size stays the model's
    kept = next(c for c in changes if c.startswith("hidden_size: kept at 96"))
    assert "modeling_tiled.py:" in kept and "n_embed = 96" in kept and "shrink: {hidden_size: N}" in kept
    # A config class's own defaults and a parameter named as the key are the config's, not hard-coded.
    assert all(param != "hidden_size" for _, param in hard_coded_widths(TILED).get(96, []) if param)
    assert small["vision_config"]["width"] == 64  # read by nothing, but nothing in the code pins 128
    # The override (npuport.yaml shrink:) wins over the kept width.
    forced, changes = shrink_config(config, {"hidden_size": 64}, TILED)
    assert forced["hidden_size"] == 64 and "hidden_size: 96 -> 64 (manifest shrink override)" in changes
    # Without the model's code (plain shrink) the width shrinks as before.
    assert shrink_config(config)[0]["hidden_size"] == 64


def test_tiled_inputs_come_from_the_models_own_preprocessing_path_and_reach_the_vision_tower(tmp_path: Path) -> None:
    entry = discover_entry(TILED)
    assert entry.inputs_fn is None and entry.run_method == "generate" and entry.run_preprocess == "infer"
    # No tokenizer file in the folder: the entry says a stand-in drives the model's own infer method.
    assert any("TiledOcrForCausalLM.infer(tokenizer, ...)" in a and "stand-in tokenizer" in a
               for a in entry.assumptions)
    manifest = entry.as_manifest_dict()
    assert manifest["run"]["preprocess"] == "infer"
    res = _harness(TILED, manifest, tmp_path, shrink=True, capture=["projector"],
                   capture_path=str(tmp_path / "capture.pt"))
    assert res["ok"], res["exception"]
    assert res["inputs"]["source"] == "preprocess", res["inputs"]
    # the shapes are the model's: one (tiles, global view) tuple at its tower's 16 px, 16 feature positions
    assert "images [((1, 3, 16, 16) float32, (1, 3, 16, 16) float32)]" in res["inputs"]["notes"][0]
    assert len(res["outputs"]["tokens"][0]) == 8 == res["outputs"]["new_tokens"]  # its generate returns new ones
    assert res["outputs"]["captured"] == ["projector"]  # the test image went through the vision tower
    assert any(c.startswith("hidden_size: kept at 96") for c in res["shrunk"])


def test_new_tokens_leave_out_a_prompt_the_output_repeats() -> None:
    import torch

    from sandbox.harness.worker import new_token_count

    prompt = torch.tensor([[5, 6, 7]])
    assert new_token_count([5, 6, 7, 1, 2], prompt) == 2  # transformers' generate: prompt + new
    assert new_token_count([1, 2], prompt) == 2  # a generate that returns only the new tokens
    assert new_token_count([5, 6, 1], prompt) == 3 and new_token_count([1, 2], None) == 2


def _tiled_model() -> tuple[object, dict]:  # type: ignore[type-arg]
    from sandbox.harness import model_build

    model_build.register_model_package(TILED)
    config = json.loads((TILED / "config.json").read_text())
    cls = model_build._load_attr("modeling_tiled:TiledOcrForCausalLM", TILED)
    return model_build.build_model(cls, config, TILED).eval(), config


def test_captured_inputs_are_what_the_preprocessing_path_built() -> None:
    import tempfile

    import torch

    from sandbox.inputs.model_inputs import capture_preprocessed_inputs

    scratch = set(Path(tempfile.gettempdir()).glob("npuport-preprocess-*"))
    model, config = _tiled_model()
    inputs, kwargs, notes = capture_preprocessed_inputs(model, "infer", TILED, config, seed=1, max_new_tokens=5)
    assert set(Path(tempfile.gettempdir()).glob("npuport-preprocess-*")) == scratch  # the test image is gone
    ids, mask = inputs["input_ids"], inputs["images_seq_mask"]
    assert ids.shape == mask.shape and int(mask.sum()) == 16 and ids[mask].eq(3).all()  # its image token
    (tiles, global_view), = inputs["images"]
    assert not tiles.any() and global_view.dtype == torch.float32  # bfloat16 in infer, cast to the model's dtype
    assert inputs["images_spatial_crop"].tolist() == [[1, 1]]
    assert "streamer" not in kwargs and "max_new_tokens" not in kwargs  # npuport decides decoding
    assert any("stand-in tokenizer" in n for n in notes)
    assert not hasattr(model, "generate") or "generate" not in vars(model)  # the intercept is gone
    again, _, _ = capture_preprocessed_inputs(model, "infer", TILED, config, seed=1)
    other, _, _ = capture_preprocessed_inputs(model, "infer", TILED, config, seed=2)
    assert torch.equal(again["images"][0][1], global_view)  # deterministic per seed
    assert not torch.equal(other["images"][0][1], global_view)


def test_the_folders_own_tokenizer_is_used_when_present(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from sandbox.inputs.model_inputs import TEST_PROMPT, capture_preprocessed_inputs

    folder = tmp_path / "tiled"
    shutil.copytree(TILED, folder)
    words = TEST_PROMPT.rstrip(".").split() + ["."]
    vocab = {"[UNK]": 0, **{w: 10 + i for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "unk_token": "[UNK]"}))
    assert "the folder's tokenizer (tokenizer.json)" in " ".join(discover_entry(folder).assumptions)
    from sandbox.harness import model_build

    model_build.register_model_package(folder)
    config = json.loads((folder / "config.json").read_text())
    model = model_build.build_model(model_build._load_attr("modeling_tiled:TiledOcrForCausalLM", folder), config,
                                    folder)
    inputs, _, notes = capture_preprocessed_inputs(model, "infer", folder, config, seed=0)
    ids = inputs["input_ids"][0][~inputs["images_seq_mask"][0]].tolist()
    assert ids == [vocab["Read"], vocab["the"], vocab["text"], vocab["in"], vocab["the"], 0], ids  # "image." unknown
    assert "the folder's tokenizer (tokenizer.json, " in notes[0], notes[0]


def test_a_preprocessing_path_that_cannot_be_driven_falls_back_with_the_reason(tmp_path: Path) -> None:
    folder = tmp_path / "tiled"
    shutil.copytree(TILED, folder)
    code = (folder / "modeling_tiled.py").read_text()
    (folder / "modeling_tiled.py").write_text(code.replace('def infer(self, tokenizer, prompt="",',
                                                           'def infer(self, tokenizer, processor, prompt="",'))
    entry = discover_entry(folder)
    res = _harness(folder, entry.as_manifest_dict(), tmp_path, shrink=True)
    assert res["inputs"]["source"] == "synthesised"
    assert "needs 'processor', which npuport cannot supply" in res["inputs"]["notes"][0]


# ----------------------------------------------------------------------------------------------
# The environment
# ----------------------------------------------------------------------------------------------

def test_dependencies_are_inferred_from_imports_and_the_transformers_coupling(tmp_path: Path) -> None:
    from agents.environment.resolve import resolve

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"transformers_version": "4.46.3"}))
    (model / "modeling_x.py").write_text(
        "import torch\nfrom einops import rearrange\nimport PIL.Image\n"
        "from transformers.utils.import_utils import is_torch_fx_available\n"
        "from transformers import PreTrainedModel\nfrom .helpers import f\n"
        "try:\n    import not_a_real_optional_dep\nexcept ImportError:\n    pass\n")
    (model / "helpers.py").write_text("def f():\n    return 1\n")
    res = resolve(model, "cpu", None)
    assert "einops" in res.install  # imported, not on this host
    # the model's era (config.json, another major release than the host's); the host's release also
    # lacks is_torch_fx_available, which the note names
    assert "transformers~=4.46.0" in res.install
    assert res.pins["transformers"] == "transformers~=4.46.0" and res.stack["transformers"] == "~=4.46.0"
    assert not any("not_a_real_optional_dep" in i or "helpers" in i for i in res.install + res.optional)
    assert any("is_torch_fx_available" in n and "modeling_x.py:4" in n for n in res.notes)
    assert "transformers~=4.46.0" in res.requirements_txt and "einops" in res.requirements_txt


def test_a_model_of_another_transformers_era_runs_in_that_era() -> None:
    # every name the fixture imports exists in the host's 5.x, but it was saved with 4.46.3: the names
    # are no proof (generate, config attributes and helpers break at run time), the era decides
    from agents.environment.compat import host_version
    from agents.environment.resolve import resolve

    res = resolve(FIXTURE, "cpu", None)
    if not (host_version("transformers") or "").startswith("5."):
        pytest.skip("the host's transformers is of the fixture's era")
    assert res.install[0] == "transformers~=4.46.0" and set(res.install[1:]) <= {"einops"}  # einops: the era's base
    assert res.stack["transformers"] == "~=4.46.0"
    assert any("environment of the model's era" in n and "4.46.3" in n for n in res.notes)


# ----------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "ascend-sim"])
def test_port_remote_code_with_shrink_validates_and_verifies(tmp_path: Path, sim_home: Path, target: str) -> None:
    out = tmp_path / "bundle"
    env = dict(os.environ, NPUPORT_HOME=str(sim_home), COLUMNS="200")
    cli = [sys.executable, "-m", "api.cli"]
    r = subprocess.run([*cli, "port", str(FIXTURE), "--target", target, "--shrink", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["numerics"]["verdict"] == "match"
    assert report["numerics"]["port_tokens"] == report["numerics"]["reference_tokens"]
    assert len(report["numerics"]["port_tokens"][0]) == 8
    assert "language_config.n_routed_experts: 16 -> 4" in (out / "report.md").read_text()
    assert json.loads((out / "run_config.json").read_text())["language_config"]["hidden_size"] == 128
    v = subprocess.run([*cli, "verify", str(out), "--original", str(FIXTURE)], capture_output=True, text=True,
                       timeout=600, env=env, cwd=REPO_ROOT)
    # exit 4 ("not verified") only for the one claim a busy host cannot check: a throughput whose runs spread
    # too far to compare; every other claim was checked and agrees
    unchecked = [ln for ln in v.stdout.splitlines() if ln.startswith("UNCHECKED")]
    assert v.returncode == 0 or (v.returncode == EXIT_NOT_VERIFIED and len(unchecked) == 1 and
                                 unchecked[0].startswith("UNCHECKED throughput") and
                                 "not comparable on this host" in unchecked[0]), v.stdout + v.stderr
    assert "DISAGREE" not in v.stdout and "AGREE     tokens match" in v.stdout, v.stdout
    # run.py runs where the bundle's constraints hold: the fixture's era (config.json: 4.46.3) is the env the
    # port ran in, not the host's 5.x, and constraints.txt pins the release it installed
    assert "transformers==4.46." in (out / "constraints.txt").read_text()
    python = _port_env_python(FIXTURE)
    run = subprocess.run([python, str(out / "run.py"), "--target", "cpu", "--repeats", "1"],
                         capture_output=True, text=True, timeout=300, cwd=out)
    assert run.returncode == 0, run.stderr
    assert str(report["numerics"]["port_tokens"][0]) in run.stdout


def _port_env_python(original: Path) -> str:
    """The interpreter of the env the port ran in, resolved again from the original as verify does (a report's
    interpreter is never trusted), or this one where the host's env serves."""
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve

    python = ensure_env(resolve(original, "cpu", None))
    return str(python) if python else sys.executable


@pytest.mark.slow
def test_port_through_the_preprocessing_path_and_run_py_builds_the_same_inputs(tmp_path: Path, sim_home: Path) -> None:
    out = tmp_path / "bundle"
    env = dict(os.environ, NPUPORT_HOME=str(sim_home), COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "api.cli", "port", str(TILED), "--target", "ascend-sim", "--shrink",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["numerics"]["verdict"] == "match"
    assert all((run.get("inputs") or {}).get("source") == "preprocess" for run in report["runs"]), report["runs"]
    assert "inputs (preprocess): inputs built by the model's own preprocessing path" in (out / "report.md").read_text()
    python = _port_env_python(TILED)  # the env the port ran in (the host's here)
    run = subprocess.run([python, str(out / "run.py"), "--target", "cpu", "--repeats", "1"],
                         capture_output=True, text=True, timeout=300, cwd=out)
    assert run.returncode == 0, run.stderr
    assert str(report["numerics"]["port_tokens"][0]) in run.stdout  # run.py drove the same path
    assert ": 8 new tokens in" in run.stdout


def test_a_generate_inherited_through_a_sibling_module_is_found(tmp_path: Path) -> None:
    # the PreTrainedModel base sits in a sibling file; config.json loads the class as a causal LM (under plain
    # AutoModel a PreTrainedModel with no generation hook is an encoder and runs forward)
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModelForCausalLM": "modeling_top.TopLM"}}))
    (tmp_path / "modeling_top.py").write_text("from .modeling_base import BaseLM\n\n\nclass TopLM(BaseLM):\n"
                                              "    def forward(self, input_ids):\n        return input_ids\n")
    (tmp_path / "modeling_base.py").write_text("from transformers import PreTrainedModel\n\n\n"
                                               "class BaseLM(PreTrainedModel):\n    pass\n")
    entry = discover_entry(tmp_path)
    assert entry.run_method == "generate"
    assert entry.run_kwargs == {"max_new_tokens": 8, "do_sample": False}  # greedy whatever the generation config


def test_run_py_seeds_and_builds_inputs_exactly_as_the_harness(tmp_path: Path) -> None:
    import torch

    from agents.deploy.runscript import model_inputs_sources, render_run_py
    from sandbox.harness import worker as harness

    for name, text in model_inputs_sources().items():  # as the bundle ships them
        (tmp_path / name).write_text(text)
    (tmp_path / "run.py").write_text(render_run_py({}, "cpu", {"entry": {"class": "m:C"}}))
    script: dict[str, object] = {"__name__": "run_py_under_test", "__file__": str(tmp_path / "run.py")}
    exec(compile((tmp_path / "run.py").read_text(), "run.py", "exec"), script)

    class Vision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(12, 7)
            self.norm = torch.nn.LayerNorm(7)

        def forward(self, input_ids, pixel_values=None, attention_mask=None):  # type: ignore[no-untyped-def]
            return input_ids

    config = {"vocab_size": 40, "vision_config": {"image_size": 8}}
    ours, theirs = Vision(), Vision()
    theirs.load_state_dict(ours.state_dict())
    harness.seed_parameters(ours, 3)
    script["model_inputs"].seed_parameters(theirs, 3)  # type: ignore[attr-defined]
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True))
    a = harness.model_inputs_for(ours, {"run": {"method": "forward"}}, tmp_path, config, 5, {})[0]
    b = script["model_inputs"].synthesise_inputs(theirs, "forward", config, 5)  # type: ignore[attr-defined]
    assert set(a) == set(b) == {"input_ids", "attention_mask", "pixel_values"}
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["pixel_values"].shape == (1, 3, 8, 8)


def test_long_token_rows_are_summarised_for_people_and_short_ones_kept() -> None:
    from agents.runs import token_summary

    prompt = [0] + [128815] * 280 + [13, 85]
    text = token_summary([prompt + [7, 7, 7]])
    assert text.startswith("[[0, 128815, 128815") and "... 274 more ..." in text and text.endswith("85, 7, 7, 7] "
                                                                                                   "(286 ids)]")
    assert token_summary([[1, 2, 3]]) == "[[1, 2, 3]]" and token_summary(None) == "None"


VLM = REPO_ROOT / "tests" / "fixtures" / "hf_processor_vlm"


def _with_processor(dest: Path) -> Path:
    """The fixture plus the files a processor-based release ships (tokenizer.json, processor_config.json,
    chat template), written with transformers' own LlavaProcessor: the placeholder expands to one token
    per 4x4 patch of a 16x16 image."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPImageProcessor, LlavaProcessor, PreTrainedTokenizerFast

    shutil.copytree(VLM, dest)
    words = ["[UNK]", "<image>", "USER:", "ASSISTANT:", "Read", "the", "text", "in", "image."]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = ("{% for m in messages %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
                "{% else %}{{ c['text'] }}{% endif %}{% endfor %} ASSISTANT:{% endfor %}")
    LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 16},
                                                      crop_size={"height": 16, "width": 16}),
                   tokenizer=fast, patch_size=4, vision_feature_select_strategy="full",
                   chat_template=template).save_pretrained(dest)
    return dest


def test_a_processor_release_gets_its_inputs_from_its_own_processor(tmp_path: Path) -> None:
    folder = _with_processor(tmp_path / "vlm")
    entry = discover_entry(folder)
    assert entry.run_preprocess == "AutoProcessor"
    assert any("the folder's own processor (AutoProcessor: processor_config.json" in a for a in entry.assumptions)
    res = _harness(folder, entry.as_manifest_dict(), tmp_path)
    assert res["ok"], res["exception"]
    assert res["inputs"]["source"] == "preprocess", res["inputs"]
    note = res["inputs"]["notes"][0]
    assert "LlavaProcessor, its own tokenizer, its chat template" in note
    assert "pixel_values (1, 3, 16, 16) float32" in note
    row = res["outputs"]["tokens"][0]
    assert row[:2] == [2, 1] and row.count(1) >= 16  # "USER:" then the placeholder expanded per patch
    assert res["outputs"]["new_tokens"] == 8 and len(row) == 8 + row.index(3) + 1  # prompt ends at "ASSISTANT:"


def test_a_processor_config_without_a_tokenizer_gets_a_stand_in_tokenizer_and_says_so(tmp_path: Path) -> None:
    folder = _with_processor(tmp_path / "vlm")
    (folder / "tokenizer.json").unlink()
    entry = discover_entry(folder)
    assert entry.run_preprocess == "AutoProcessor"  # the processor path is still driven (its image side is real)
    assert any("tokenizer files" in a and "are not in the folder" in a and "stand-in tokenizer" in a
               for a in entry.assumptions), entry.assumptions


def test_a_tokenizer_config_whose_tokenizer_does_not_load_falls_back_to_the_stand_in_with_the_reason(
        tmp_path: Path) -> None:
    from sandbox.harness import model_build
    from sandbox.inputs.model_inputs import capture_preprocessed_inputs

    folder = tmp_path / "tiled"
    shutil.copytree(TILED, folder)
    # a custom tokenizer class through auto_map whose module is not in the folder (a vocabulary or code file
    # the release did not ship)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "TiledTokenizer",
         "auto_map": {"AutoTokenizer": ["tokenization_tiled.TiledTokenizer", None]},
         "added_tokens_decoder": {"5": {"content": "<|eot|>", "special": True}}, "eos_token": "<|eot|>"}))
    assert any("if AutoTokenizer loads it" in a for a in discover_entry(folder).assumptions)
    model_build.register_model_package(folder)
    config = json.loads((folder / "config.json").read_text())
    model = model_build.build_model(model_build._load_attr("modeling_tiled:TiledOcrForCausalLM", folder), config,
                                    folder)
    inputs, _, notes = capture_preprocessed_inputs(model, "infer", folder, config, seed=0)
    assert "a stand-in tokenizer (the folder's tokenizer does not load here (" in notes[0]
    assert int(inputs["images_seq_mask"].sum()) == 16


TEXT_GENERATE = REPO_ROOT / "tests" / "fixtures" / "hf_text_generate"


def test_a_wrapper_whose_generate_takes_text_is_validated_through_its_language_model(tmp_path: Path) -> None:
    """``generate(self, text, image=None)`` takes no token ids, and the model's own path cannot be driven (it
    ships no tokenizer): the run calls its language model's generate on ids instead of failing with
    "generate() missing 'text'", and says that the image path was not exercised."""
    entry = discover_entry(TEXT_GENERATE)
    assert entry.run_method == "generate" and entry.run_preprocess is None
    res = _harness(TEXT_GENERATE, entry.as_manifest_dict(), tmp_path, run_kwargs={"max_new_tokens": 4,
                                                                                 "do_sample": False})
    assert res["ok"], res.get("exception")
    assert res["inputs"]["method"] == "language_model.generate"
    assert any("generate takes text" in n and "LlamaForCausalLM" in n and "not exercised" in n
               for n in res["inputs"]["notes"]), res["inputs"]["notes"]
    assert res["outputs"]["new_tokens"] == 4



def test_a_models_own_generate_that_builds_its_mask_gets_none() -> None:
    """Synthesised inputs for a generate of the model's own that names its ids and pixels but no mask carry
    none (a mask of the ids' length no longer fits once image features are merged in: Florence-2's
    'Attention mask should be of size (1, 1, 10, 10), but is torch.Size([1, 1, 8, 8])'); its forward, and a
    generate that passes everything through, still get one."""
    import torch

    from sandbox.inputs.model_inputs import builds_own_mask, synthesise_inputs

    class MergesImages(torch.nn.Module):  # its own generate merges image features and builds the mask itself
        def forward(self, input_ids, attention_mask=None, pixel_values=None):  # type: ignore[no-untyped-def]
            return input_ids

        def generate(self, input_ids, inputs_embeds=None, pixel_values=None, **kwargs):  # type: ignore[no-untyped-def]
            return input_ids

    class PassesThrough(MergesImages):
        def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return args

    config = {"vocab_size": 100, "image_size": 16}
    model = MergesImages()
    assert builds_own_mask(model, "generate") and not builds_own_mask(model, "forward")
    assert set(synthesise_inputs(model, "generate", config, 0)) == {"input_ids", "pixel_values"}
    assert set(synthesise_inputs(model, "forward", config, 0)) == {"input_ids", "attention_mask", "pixel_values"}
    assert "attention_mask" in synthesise_inputs(PassesThrough(), "generate", config, 0)


def test_pixels_that_come_with_a_grid_are_left_out_and_the_text_runs_alone() -> None:
    """A model that takes its images as packed patches with each image's (t, h, w) grid (``grid_thws``,
    ``image_grid_thw``) got a made-up (1, 3, H, W) image batch and no grid, and died in its vision tower
    ("'NoneType' object has no attribute 'ndim'"). The grid is a structure npuport does not guess: without
    the model's processor the pixels are left out and the text runs alone; a model without a grid still
    gets its image batch."""
    import torch

    from sandbox.inputs.model_inputs import pixel_grid_names, synthesise_inputs

    class PackedPatches(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, pixel_values=None, grid_thws=None):  # type: ignore[no-untyped-def]
            return input_ids

    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, pixel_values=None):  # type: ignore[no-untyped-def]
            return input_ids

    config = {"vocab_size": 100, "image_size": 16}
    assert pixel_grid_names(PackedPatches(), "generate") == ["grid_thws"]
    assert set(synthesise_inputs(PackedPatches(), "generate", config, 0)) == {"input_ids", "attention_mask"}
    assert pixel_grid_names(Plain(), "generate") == []
    plain = synthesise_inputs(Plain(), "generate", config, 0)
    assert set(plain) == {"input_ids", "attention_mask", "pixel_values"}
    assert tuple(plain["pixel_values"].shape) == (1, 3, 16, 16)


def test_a_preprocessing_method_gets_an_empty_history_and_none_where_its_signature_admits_none(
        tmp_path: Path) -> None:
    """A chat-style method whose conversation and options are required but typed Optional (no default) is
    driven, not given up: its history is empty and another Optional parameter gets None."""
    from typing import Optional  # noqa: UP035 - the annotation as old remote code writes it

    from sandbox.inputs.inputs_base import PreprocessingFailed
    from sandbox.inputs.model_inputs import preprocessing_arguments

    def chat(tokenizer: object, query: str, history: Optional[list[tuple[str, str]]],  # noqa: UP045
             stop_words: list[int] | None, limit: int, system: str = "You are a helpful assistant.") -> None: ...

    chat.__annotations__["limit"] = Optional[int]  # noqa: UP045 - an annotation object, not text
    args = preprocessing_arguments(chat, object(), {}, 0, tmp_path, 4)
    assert args["history"] == [] and args["stop_words"] is None and args["limit"] is None and "system" not in args
    assert args["query"]

    def needs_a_path(tokenizer: object, query: str, audio_file: str) -> None: ...

    with pytest.raises(PreprocessingFailed, match="needs 'audio_file'"):
        preprocessing_arguments(needs_a_path, object(), {}, 0, tmp_path, 4)
