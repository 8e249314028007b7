"""Evidence that covers the whole model (issue 40, class 4): the shrink keeps one layer of every kind the config
names, every tower runs on inputs the model's own processor or its signatures give, the harness records which
module kinds ran, and a port whose evidence misses one is "validated (partial: ...)". The toy models are written
by tests/coverage_models.py; harness runs are real subprocesses of this checkout's harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.models import RunRecord
from agents.report.bundle import final_status
from agents.report.coverage_section import coverage_markdown
from agents.validation.coverage import merged_coverage
from agents.validation.perf_evidence import verdict
from sandbox.harness.shrink import shrink_config
from tests.conftest import REPO_ROOT
from tests.coverage_models import (
    LAYER_TYPES,
    TEXT_CONFIG,
    write_audio_lm,
    write_hybrid,
    write_tokenizer_and_image_processor,
    write_vlm,
)

BOOT = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); from sandbox.harness.worker import main; "
        "sys.exit(main(sys.argv[1:]))")


def _harness(model: Path, cls: str, tmp_path: Path, preprocess: str | None = None) -> dict[str, Any]:
    """One shrunk harness run of ``model`` on the CPU, this checkout's harness (as the sandbox boots it)."""
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    run_dir.mkdir()
    run = {"method": "generate", "kwargs": {"max_new_tokens": 4}, **({"preprocess": preprocess} if preprocess else {})}
    (run_dir / "spec.json").write_text(json.dumps({
        "model_dir": str(model), "manifest": {"entry": {"class": cls}, "config": "config.json", "run": run},
        "device": "cpu", "seed": 0, "shrink": True, "result_path": str(run_dir / "result.json")}))
    subprocess.run([sys.executable, "-I", "-B", "-c", BOOT, str(run_dir / "spec.json")], cwd=run_dir,
                   capture_output=True, text=True, timeout=300)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["ok"], result.get("exception")
    return result


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hybrid")
    return _harness(write_hybrid(tmp / "hybrid"), "modeling_hybrid:HybridLM", tmp)


def _kinds(result: dict[str, Any]) -> dict[str, bool | None]:
    return {k["kind"]: k["ran"] for k in result["coverage"]["kinds"]}


# ----------------------------------------------------------------------------------------------
# The shrink keeps every layer kind
# ----------------------------------------------------------------------------------------------

def test_a_hybrid_stack_keeps_one_layer_of_each_kind_its_per_layer_list_names() -> None:
    config = {**TEXT_CONFIG, "num_hidden_layers": len(LAYER_TYPES), "layer_types": LAYER_TYPES}
    small, changes = shrink_config(config)
    # the first two layers are both linear attention: keeping them would drop the softmax-attention kind
    assert small["layer_types"] == ["linear_attention", "full_attention"]
    assert small["num_hidden_layers"] == 2
    assert any(c.startswith("num_hidden_layers: 8 -> 2") and "layers 0, 3 of 8 kept" in c for c in changes)
    assert config["layer_types"] == LAYER_TYPES, "the input config is not modified"


def test_every_shape_of_a_layer_kind_rule_is_remapped_onto_the_kept_layers() -> None:
    three = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 12,
             "hybrid_override_pattern": "MMM*MMM-MMM*",  # a pattern string: mamba, attention, MLP layers
             "mlp_only_layers": [5, 6],                   # an index list
             "first_k_dense_replace": 2}                  # a boundary
    small, _ = shrink_config(three)
    pattern = small["hybrid_override_pattern"]
    assert set(pattern) == {"M", "*", "-"} and len(pattern) == small["num_hidden_layers"]
    assert small["mlp_only_layers"] and all(i < small["num_hidden_layers"] for i in small["mlp_only_layers"])
    assert 0 < small["first_k_dense_replace"] < small["num_hidden_layers"]
    # a period (every 8th layer attention, offset 4): 2 and its offset mod 2, so two consecutive layers hold both
    periodic, _ = shrink_config({"num_hidden_layers": 32, "attn_layer_period": 8, "attn_layer_offset": 4,
                                 "expert_layer_period": 2, "expert_layer_offset": 1})
    assert (periodic["attn_layer_period"], periodic["attn_layer_offset"]) == (2, 0)
    assert (periodic["expert_layer_period"], periodic["expert_layer_offset"], periodic["num_hidden_layers"]) == (2, 1,
                                                                                                                 2)
    # a per-layer list of sizes that grow layer by layer is a schedule, not kinds: two layers, its first values
    schedule, _ = shrink_config({"num_hidden_layers": 8, "num_query_heads": [4, 4, 6, 6, 8, 8, 10, 10]})
    assert schedule["num_hidden_layers"] == 2 and schedule["num_query_heads"] == [4, 4]


def test_a_per_layer_top_k_is_no_larger_than_the_shrunk_experts() -> None:
    small, _ = shrink_config({"num_hidden_layers": 32, "num_experts": 64, "moe_topk": [8] * 32})
    assert small["num_experts"] == 4 and small["moe_topk"] == [2, 2]  # torch.topk(k=8) of 4 experts would raise


def test_per_layer_size_lists_the_shrink_keeps_are_read_by_the_deployment_facts() -> None:
    from agents.tuning.space import model_facts

    small, _ = shrink_config({"num_hidden_layers": 32, "num_experts": 64, "hidden_size": 4096,
                              "num_attention_heads": 32, "moe_intermediate_size": [3072] * 32})
    assert small["moe_intermediate_size"] == [3072, 3072]
    assert model_facts(small).intermediate_size == 3072  # int() of the list raised in the reporter


def test_a_projection_width_follows_the_level_it_feeds() -> None:
    config = {"hidden_size": 512, "text_config": dict(TEXT_CONFIG),
              "audio_config": {"d_model": 384, "encoder_attention_heads": 6}}
    small, changes = shrink_config(config)
    # the top level has no heads: its width is the projection into the text model, which shrank to 4 x 64
    assert small["text_config"]["hidden_size"] == 256
    assert small["hidden_size"] == 256
    assert "hidden_size: 512 -> 256 (with text_config.hidden_size, the level it feeds)" in changes


# ----------------------------------------------------------------------------------------------
# The towers run, and the harness records what ran
# ----------------------------------------------------------------------------------------------

def test_the_shrunk_hybrid_runs_both_layer_kinds_and_the_record_says_so(hybrid_run: dict[str, Any]) -> None:
    kinds = _kinds(hybrid_run)
    assert kinds["layers: Block (mixer: LinearAttention)"] is True
    assert kinds["layers: Block (mixer: SoftmaxAttention)"] is True
    assert kinds["layer_types=linear_attention"] is True and kinds["layer_types=full_attention"] is True


def test_an_audio_encoder_runs_on_features_of_the_configs_sizes(tmp_path: Path) -> None:
    result = _harness(write_audio_lm(tmp_path / "audio"), "modeling_audio_lm:AudioLM", tmp_path)
    assert "input_features" in result["inputs"]["notes"][0]
    assert any("16 mel bins (num_mel_bins) x 128 frames" in n for n in result["inputs"]["notes"])
    kinds = _kinds(result)
    assert kinds["audio_tower (AudioEncoder)"] is True and kinds["audio_tower.layers: Block"] is True
    assert kinds["projector (Sequential)"] is True  # the projection into the shrunk text model ran: widths agree
    assert result["shrunk_config"]["hidden_size"] == result["shrunk_config"]["text_config"]["hidden_size"]


def test_an_audio_processor_the_folder_only_names_is_built_and_feeds_the_encoder(tmp_path: Path) -> None:
    model = write_audio_lm(tmp_path / "audio", processor=True)
    result = _harness(model, "modeling_audio_lm:AudioLM", tmp_path, preprocess="AutoProcessor")
    note = result["inputs"]["notes"][0]
    assert result["inputs"]["source"] == "preprocess"
    assert "transformers' WhisperFeatureExtractor (feature_size 16, sampling_rate 16000 from the config)" in note
    assert "a test waveform" in note and "input_features (1, 16, 100)" in note
    assert _kinds(result)["audio_tower (AudioEncoder)"] is True


class _MessagesProcessor:
    """A processor whose call takes chat messages, the image a dict holding its path (a Flamingo-style release)."""

    image_processor = object()

    def __call__(self, prompts: list[dict[str, Any]]) -> dict[str, Any]:
        import torch
        from PIL import Image

        pieces = prompts[0]["content"]
        side = Image.open(next(p["image"] for p in pieces if isinstance(p, dict))).size[0]
        text = "".join(p for p in pieces if isinstance(p, str))
        return {"input_ids": torch.tensor([[ord(c) % 50 for c in text]]),
                "batch_images": torch.zeros(1, 1, 1, 3, side, side)}


def test_a_processor_that_takes_chat_messages_gets_the_image_inside_them() -> None:
    from sandbox.inputs.processor_inputs import _call_processor

    out, how, _, fed = _call_processor(_MessagesProcessor(), {"vision_config": {"image_size": 40}}, 0)
    assert how == "chat messages (an image dict and a text string)" and fed == ["image"]
    assert tuple(out["batch_images"].shape) == (1, 1, 1, 3, 40, 40) and out["input_ids"].shape[1] > 0


def test_a_vlm_without_a_processor_feeds_its_vision_tower_synthesised_pixels(tmp_path: Path) -> None:
    result = _harness(write_vlm(tmp_path / "vlm"), "modeling_vlm:PrefixVLM", tmp_path)
    assert "image_tensor: synthesised pixels (1, 3, 48, 48), the image size from img_size" in result["inputs"]["notes"]
    kinds = _kinds(result)
    assert kinds["visual (VisionTower)"] is True and kinds["visual.layers: Block"] is True
    assert "mm_projector" in result["coverage"]["ran"]


def test_a_tokenizer_beside_an_image_processor_feeds_the_tower_the_image_processors_pixels(tmp_path: Path) -> None:
    model = write_vlm(tmp_path / "vlm", pixels="pixel_values")
    write_tokenizer_and_image_processor(model, side=48)
    result = _harness(model, "modeling_vlm:PrefixVLM", tmp_path, preprocess="AutoProcessor")
    note = result["inputs"]["notes"][0]
    assert "with the folder's image processor CLIPImageProcessor" in note
    assert "the tokenizer prepared by PrefixVLM.update_special_tokens(tokenizer)" in note
    assert "pixel_values (1, 3, 48, 48)" in note
    assert _kinds(result)["visual (VisionTower)"] is True


def test_sizes_a_config_class_fills_in_by_default_at_a_nested_level_are_shrunk() -> None:
    from transformers import LlamaConfig, PretrainedConfig

    from sandbox.harness.shrink_fit import sized_by_class_defaults

    class Wrapper(PretrainedConfig):
        model_type = "npuport_toy_wrapper"

        def __init__(self, text_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
            self.text_config = LlamaConfig(**(text_config or {}))
            super().__init__(**kwargs)

    written = {"text_config": {"model_type": "llama"}}  # a nested level written as its diff from the defaults
    full, notes = sized_by_class_defaults(written, lambda c: Wrapper(**c))
    assert full["text_config"]["num_hidden_layers"] == 32 and full["text_config"]["hidden_size"] == 4096
    assert notes and notes[0].startswith("text_config: ") and "from its config class's defaults" in notes[0]
    small, _ = shrink_config(full)
    assert (small["text_config"]["num_hidden_layers"], small["text_config"]["hidden_size"]) == (2, 512)


# ----------------------------------------------------------------------------------------------
# The verdict says partial
# ----------------------------------------------------------------------------------------------

def _record(result: dict[str, Any], purpose: str, tmp_path: Path) -> RunRecord:
    return RunRecord(id=purpose, purpose=purpose, target="cpu", ok=True, status="ok", wall_s=1.0,  # type: ignore[arg-type]
                     result_path=str(tmp_path / "result.json"), tokens=result["outputs"]["tokens"],
                     coverage=result["coverage"])


def test_a_tower_the_inputs_cannot_reach_makes_the_verdict_partial(tmp_path: Path) -> None:
    # the pixels go in under a name that says nothing of an image: the text runs alone
    result = _harness(write_vlm(tmp_path / "vlm", pixels="glyphs"), "modeling_vlm:PrefixVLM", tmp_path)
    assert any(n.startswith("generate also takes glyphs, left out") for n in result["inputs"]["notes"])
    coverage = merged_coverage(_record(result, "port", tmp_path), _record(result, "reference", tmp_path))
    assert "visual (VisionTower)" in coverage["not_covered"] and "visual.layers: Block" in coverage["not_covered"]
    assert "language_model (TextModel)" not in coverage["not_covered"]
    words = verdict("validated", {}, coverage)
    assert words.startswith("validated (partial: ") and "visual (VisionTower)" in words
    state = {"numerics": {"verdict": "match", "compared": "tokens", "coverage": coverage}, "perf": {}}
    status, reason = final_status(state)
    assert status == "validated"  # the exit code stays 0: the words say partial
    assert "the evidence does not cover 2 module kind(s)" in reason
    section = "\n".join(coverage_markdown({"coverage": coverage}))
    assert "**partial**" in section
    assert "| `visual (VisionTower)` | part | **did not run** | **did not run** |" in section
    assert "`mm_projector`" in section  # listed with the modules that did not run


def test_a_port_that_runs_every_kind_is_plainly_validated(hybrid_run: dict[str, Any], tmp_path: Path) -> None:
    coverage = merged_coverage(_record(hybrid_run, "port", tmp_path), _record(hybrid_run, "reference", tmp_path))
    assert coverage["not_covered"] == [] and verdict("validated", {}, coverage) == "validated"
    assert "every module kind recorded ran" in "\n".join(coverage_markdown({"coverage": coverage}))


# ----------------------------------------------------------------------------------------------
# End to end
# ----------------------------------------------------------------------------------------------

def _port(model: Path, out: Path, home: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = dict(os.environ, NPUPORT_HOME=str(home), COLUMNS="400", NPUPORT_SERVE="0")
    r = subprocess.run([sys.executable, "-m", "api.cli", "port", str(model), "--target", "ascend-sim", "--shrink",
                        "--out", str(out)], capture_output=True, text=True, timeout=900, env=env, cwd=REPO_ROOT)
    return r, json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_a_hybrid_port_reports_that_every_kind_ran(tmp_path: Path, sim_home: Path) -> None:
    r, report = _port(write_hybrid(tmp_path / "hybrid"), tmp_path / "bundle", sim_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert report["verdict"] == "validated" and report["coverage"]["not_covered"] == []
    kinds = {k["kind"]: (k["port"], k["reference"]) for k in report["coverage"]["kinds"]}
    assert kinds["layer_types=full_attention"] == (True, True)
    assert kinds["layers: Block (mixer: SoftmaxAttention)"] == (True, True)
    md = (tmp_path / "bundle" / "report.md").read_text()
    assert "every module kind recorded ran in both the port and the reference" in md
    assert "layers 0, 3 of 8 kept" in md  # the Shrunk config section says which layers were kept


@pytest.mark.slow
def test_a_port_whose_tower_is_not_fed_says_partial_everywhere(tmp_path: Path, sim_home: Path) -> None:
    r, report = _port(write_vlm(tmp_path / "vlm", pixels="glyphs"), tmp_path / "bundle", sim_home)
    assert r.returncode == 0, r.stdout + r.stderr  # validated-partial keeps exit code 0
    assert report["status"] == "validated" and report["verdict"].startswith("validated (partial: ")
    assert "visual (VisionTower)" in report["coverage"]["not_covered"]
    assert "validated (partial: " in r.stdout.replace("\n", " ")  # the CLI's final line
    md = (tmp_path / "bundle" / "report.md").read_text()
    assert "**validated (partial: " in md.split("\n\n")[1]  # the summary's verdict line
    assert "## Coverage" in md and "**did not run**" in md


def test_a_layer_list_with_empty_slots_and_a_tower_called_through_forward_are_read() -> None:
    import torch
    from torch import nn

    from sandbox.harness.coverage import CoverageRecorder

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Sequential(nn.Linear(4, 4))

        def forward(self, x: Any) -> Any:
            return self.attn(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower = nn.Sequential(Block(), Block())
            self.cross = nn.ModuleList([None, Block()])  # a cross-attention every other layer
            self.layers = nn.ModuleList([Block(), Block()])

        def forward(self, x: Any) -> Any:
            x = self.tower.forward(x)  # .forward(...) bypasses the tower's own hooks, not its layers'
            return self.layers[1](self.cross[1](x))

    model = Model()
    recorder = CoverageRecorder(model, {}, None)
    model(torch.zeros(1, 4))
    kinds = {k["kind"]: k["ran"] for k in recorder.report()["kinds"]}
    assert kinds["tower: Block"] is True and kinds["cross: Block"] is True and kinds["layers: Block"] is True


def test_a_list_as_long_as_the_shrunk_layer_count_is_not_a_layer_type_unless_the_full_config_says_so() -> None:
    import torch

    from sandbox.harness.coverage import CoverageRecorder

    full = {"num_hidden_layers": 32, "dense_list": [4096, 0], "layer_types": ["a", "b"] * 16}
    run, _ = shrink_config(full)
    assert run["num_hidden_layers"] == 2 and run["dense_list"] == [4096, 0]  # two items, two layers: by chance
    kinds = [k["kind"] for k in CoverageRecorder(torch.nn.Linear(2, 2), run, full).report()["kinds"]]
    assert kinds == ["layer_types=a", "layer_types=b"]
