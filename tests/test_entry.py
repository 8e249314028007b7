"""Model entry discovery (agents/reading/entry.py): manifest, config.json auto_map, generated; errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from agents.reading.entry import discover_entry
from knowledge.errors import EntryNotFound, ManifestError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

MODELING = """
import torch
from torch import nn


class TinyConfig:
    def __init__(self, d=4):
        self.d = d


class TinyBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x)


class TinyPreTrainedModel(nn.Module):
    def _init_weights(self, m):
        pass


class TinyForCausalLM(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__()
        self.block = TinyBlock(config["d"])

    def forward(self, input_ids):
        return self.block(input_ids.float())

    def generate(self, input_ids, max_new_tokens=4):
        return input_ids[:, :max_new_tokens]
"""

INPUTS = """
import torch


def make_inputs(config, seed):
    return {"input_ids": torch.zeros(1, 4, dtype=torch.long)}


def decode(config, ids):
    return "".join(map(str, ids))
"""


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text).lstrip("\n"))


def make_model(root: Path, *, manifest: dict | None = None, auto_map: dict | None = None) -> Path:
    write(root, "modeling_tiny.py", MODELING)
    write(root, "sample_inputs.py", INPUTS)
    config: dict = {"model_type": "tiny", "d": 4}
    if auto_map is not None:
        config["auto_map"] = auto_map
    (root / "config.json").write_text(json.dumps(config))
    if manifest is not None:
        (root / "npuport.yaml").write_text(yaml.safe_dump(manifest))
    return root


def good_manifest(**over: object) -> dict:
    m: dict = {"name": "tiny", "entry": {"class": "modeling_tiny:TinyForCausalLM"}, "config": "config.json",
               "inputs": "sample_inputs:make_inputs", "decode": "sample_inputs:decode",
               "run": {"method": "generate", "kwargs": {"max_new_tokens": 3}}, "shrink": {"d": 2}}
    m.update(over)
    return m


# --- manifest -------------------------------------------------------------------------------

def test_manifest_entry(tmp_path: Path) -> None:
    info = discover_entry(make_model(tmp_path, manifest=good_manifest()))
    assert info.kind == "manifest"
    assert (info.module, info.module_file, info.class_name) == ("modeling_tiny", "modeling_tiny.py",
                                                                "TinyForCausalLM")
    assert (info.inputs_fn, info.decode_fn, info.run_method) == ("sample_inputs:make_inputs",
                                                                 "sample_inputs:decode", "generate")
    assert info.run_kwargs == {"max_new_tokens": 3} and info.shrink == {"d": 2}
    assert info.as_manifest_dict() == good_manifest()


def test_manifest_with_auto_map_entry(tmp_path: Path) -> None:
    make_model(tmp_path, manifest=good_manifest(entry={"auto_map": "AutoModelForCausalLM"}),
               auto_map={"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"})
    info = discover_entry(tmp_path)
    assert info.kind == "manifest" and info.class_name == "TinyForCausalLM"
    assert info.as_manifest_dict()["entry"] == {"class": "modeling_tiny:TinyForCausalLM"}
    assert any("auto_map" in a for a in info.assumptions)


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"inputs": None}, "inputs", "Field required"),
    ({"entry": {"class": "modeling_tiny.TinyForCausalLM"}}, "entry.class", "pattern"),
    ({"entry": {"class": "modeling_tiny:Missing"}}, "entry.class", "has no class Missing"),
    ({"entry": {"class": "nowhere:TinyForCausalLM"}}, "entry.class", "no module nowhere"),
    ({"entry": {"class": "modeling_tiny:TinyForCausalLM", "auto_map": "AutoModel"}}, "entry", "exactly one"),
    ({"entry": {"auto_map": "AutoModelForCausalLM"}}, "entry.auto_map", "no auto_map entry"),
    ({"inputs": "sample_inputs:nope"}, "inputs", "has no function nope"),
    ({"config": "missing.json"}, "config", "does not exist"),
    ({"run": {"method": "generate", "kwarg": {}}}, "run.kwarg", "Extra inputs"),
    ({"shrink": [1, 2]}, "shrink", "dictionary"),
])
def test_manifest_errors_name_the_field(tmp_path: Path, change: dict, field: str, words: str) -> None:
    manifest = good_manifest(**change)
    manifest = {k: v for k, v in manifest.items() if v is not None}
    make_model(tmp_path, manifest=manifest)
    with pytest.raises(ManifestError) as exc:
        discover_entry(tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"npuport.yaml: {field}:"), msg
    assert words in msg
    assert "\n" not in msg


def test_manifest_invalid_yaml(tmp_path: Path) -> None:
    make_model(tmp_path)
    (tmp_path / "npuport.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ManifestError, match="not valid YAML"):
        discover_entry(tmp_path)


def test_manifest_error_is_an_entry_not_found(tmp_path: Path) -> None:
    make_model(tmp_path, manifest={"name": "x"})
    with pytest.raises(EntryNotFound):
        discover_entry(tmp_path)


# --- auto_map -------------------------------------------------------------------------------

def test_auto_map_entry(tmp_path: Path) -> None:
    make_model(tmp_path, auto_map={"AutoConfig": "modeling_tiny.TinyConfig",
                                   "AutoModel": "modeling_tiny.TinyBlock",
                                   "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"})
    info = discover_entry(tmp_path)
    assert info.kind == "auto_map"
    assert (info.class_name, info.module_file, info.config_path) == ("TinyForCausalLM", "modeling_tiny.py",
                                                                     "config.json")
    assert info.run_method == "generate" and info.run_kwargs == {"max_new_tokens": 8}
    assert info.inputs_fn == "sample_inputs:make_inputs" and info.decode_fn == "sample_inputs:decode"
    assert info.name == "tiny"
    m = info.as_manifest_dict()
    assert m["entry"] == {"class": "modeling_tiny:TinyForCausalLM"} and m["config"] == "config.json"


def test_auto_map_with_repo_prefix_and_vision2seq(tmp_path: Path) -> None:
    make_model(tmp_path, auto_map={"AutoModelForVision2Seq": "someone/tiny--modeling_tiny.TinyForCausalLM"})
    info = discover_entry(tmp_path)
    assert (info.kind, info.module, info.class_name) == ("auto_map", "modeling_tiny", "TinyForCausalLM")


def test_auto_map_without_generate_runs_forward(tmp_path: Path) -> None:
    make_model(tmp_path, auto_map={"AutoModel": "modeling_tiny.TinyBlock"})
    info = discover_entry(tmp_path)
    assert info.run_method == "forward" and info.run_kwargs == {}
    assert any("no generate" in a for a in info.assumptions)


def test_auto_map_names_a_missing_class(tmp_path: Path) -> None:
    make_model(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_tiny.GhostForCausalLM"})
    with pytest.raises(EntryNotFound, match="modeling_tiny.py has no class GhostForCausalLM"):
        discover_entry(tmp_path)


def test_auto_map_names_a_missing_module(tmp_path: Path) -> None:
    make_model(tmp_path, auto_map={"AutoModelForCausalLM": "modeling_gone.TinyForCausalLM"})
    with pytest.raises(EntryNotFound, match="no module modeling_gone"):
        discover_entry(tmp_path)


# --- generated ------------------------------------------------------------------------------

def test_generated_entry_picks_the_top_level_module(tmp_path: Path) -> None:
    write(tmp_path, "model.py", MODELING)
    write(tmp_path, "data.py", INPUTS)
    info = discover_entry(tmp_path)
    assert info.kind == "generated"
    # TinyBlock is used inside TinyForCausalLM; TinyPreTrainedModel has no forward
    assert (info.module, info.class_name, info.run_method) == ("model", "TinyForCausalLM", "generate")
    assert info.config_path is None and info.inputs_fn == "data:make_inputs"
    text = " | ".join(info.assumptions)
    assert "picked TinyForCausalLM" in text and "no config.json" in text
    assert "config" not in info.as_manifest_dict()


def test_generated_entry_lists_other_candidates(tmp_path: Path) -> None:
    write(tmp_path, "a.py", """
        import torch.nn as nn
        class Encoder(nn.Module):
            def forward(self, x):
                return x
        class Classifier(nn.Module):
            def forward(self, x):
                return x
            def extra(self):
                return 1
        """)
    info = discover_entry(tmp_path)
    assert info.class_name == "Classifier"  # larger of two unrelated roots; neither has generate
    assert any("Encoder" in a for a in info.assumptions)
    assert info.run_method == "forward" and info.inputs_fn is None


def test_no_python_files(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("nothing here\n")
    with pytest.raises(EntryNotFound, match="no Python files"):
        discover_entry(tmp_path)


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "pkg/model.py", "import torch\n\nclass M(torch.nn.Module:\n    pass\n")
    with pytest.raises(EntryNotFound, match=r"syntax error in the model: pkg/model.py:3"):
        discover_entry(tmp_path)


def test_no_module_class(tmp_path: Path) -> None:
    write(tmp_path, "util.py", "def helper():\n    return 1\n")
    with pytest.raises(EntryNotFound, match="no nn.Module subclass"):
        discover_entry(tmp_path)


def test_example_ocr_mini_manifest() -> None:
    root = EXAMPLES / "ocr_mini"
    if not (root / "npuport.yaml").is_file():
        pytest.skip("examples/ocr_mini is not in this checkout")
    info = discover_entry(root)
    raw = yaml.safe_load((root / "npuport.yaml").read_text())
    assert info.kind == "manifest"
    assert info.as_manifest_dict()["entry"] == raw["entry"]
    assert info.as_manifest_dict()["run"] == raw["run"]
