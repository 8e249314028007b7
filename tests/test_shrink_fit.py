"""Shrink that respects the code (issue 25, class 3): the small config is fitted to the model's
constructor on the meta device, backing off where the code's invariants refuse the derived sizes; the
per-head size is kept; a width is kept as "hard-coded" only on the strength of a line that uses it as a size."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

from sandbox.harness.shrink import hard_coded_widths, shrink_config
from sandbox.harness.shrink_fit import fit_to_constructor

MODEL = '''import torch
from torch import nn


class VisionTower(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        embed_dim = cfg["embed_dim"]
        num_heads = embed_dim // 128  # the code's invariant: 128 per head, whatever the config says
        self.attn = nn.MultiheadAttention(embed_dim, num_heads)
        self.blocks = nn.ModuleList(nn.Linear(embed_dim, embed_dim) for _ in range(cfg["depth"]))


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.vision = VisionTower(config["vision_config"])
        self.emb = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.proj = nn.Linear(config["vision_config"]["embed_dim"], config["hidden_size"])
        self.layers = nn.ModuleList(nn.Linear(config["hidden_size"], config["hidden_size"])
                                    for _ in range(config["num_hidden_layers"]))
        self.probe = torch.zeros(1)
'''

CONFIG = {"vocab_size": 100, "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
          "vision_config": {"embed_dim": 1024, "depth": 24}}


def _model_class(tmp_path: Path) -> Any:
    (tmp_path / "modeling_fit.py").write_text(MODEL)
    spec = importlib.util.spec_from_file_location("modeling_fit", tmp_path / "modeling_fit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("modeling_fit", None)
    spec.loader.exec_module(module)
    return module.Model


def test_the_derived_config_breaks_the_constructors_invariant_and_the_fit_backs_off(tmp_path: Path) -> None:
    model_cls = _model_class(tmp_path)
    derived, _ = shrink_config(CONFIG)
    assert derived["vision_config"]["embed_dim"] == 64  # no heads to go by: 64 // 128 == 0 heads
    try:
        model_cls(derived)
        raise AssertionError("the derived config should break num_heads = embed_dim // 128")
    except (AssertionError, ValueError, ZeroDivisionError) as exc:
        assert "num_heads" in str(exc) or "divisible" in str(exc) or isinstance(exc, ZeroDivisionError)
    devices: list[torch.device] = []

    def build(cfg: dict[str, Any]) -> Any:
        model = model_cls(cfg)
        devices.append(model.probe.device)
        return model

    small, changes = fit_to_constructor(build, CONFIG, {}, tmp_path)
    assert small["vision_config"] == {"embed_dim": 1024, "depth": 2}  # its widths kept, its depth shrunk
    assert (small["hidden_size"], small["num_attention_heads"], small["num_hidden_layers"]) == (512, 4, 2)
    note = changes[-1]
    assert note.startswith("backed off to keep vision_config as written")
    assert "modeling_fit.py:10" in note  # the line of the MultiheadAttention the derived sizes broke
    assert devices and all(d.type == "meta" for d in devices)  # trial builds allocate nothing
    model_cls(small)  # and the fitted config builds for real


def test_a_config_the_constructor_accepts_is_the_derived_one(tmp_path: Path) -> None:
    model_cls = _model_class(tmp_path)
    fine = {**CONFIG, "vision_config": {"embed_dim": 1024, "depth": 24, "num_heads": 8}}
    small, changes = fit_to_constructor(model_cls, fine, {"num_hidden_layers": 1}, tmp_path)
    assert small["vision_config"]["embed_dim"] == 512  # 4 heads of 128: the per-head size kept
    assert small["num_hidden_layers"] == 1  # the manifest's override still wins
    assert not any(c.startswith("backed off") for c in changes)


def test_per_head_size_is_kept_and_head_dim_keys_are_not_shrunk() -> None:
    small, _ = shrink_config({"hidden_size": 2048, "num_attention_heads": 16, "head_dim": 96,
                              "qk_rope_head_dim": 64, "kv_lora_rank": 512, "num_key_value_heads": 4})
    assert (small["num_attention_heads"], small["hidden_size"], small["head_dim"]) == (4, 384, 96)
    assert small["qk_rope_head_dim"] == 64 and small["kv_lora_rank"] == 16
    assert small["num_attention_heads"] % small["num_key_value_heads"] == 0


def test_a_width_is_kept_only_for_a_line_that_uses_it_as_a_size(tmp_path: Path) -> None:
    config = {"hidden_size": 1280, "num_attention_heads": 10, "num_hidden_layers": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "modeling_a.py").write_text("TIMEOUT = 1280\nMAX_LENGTH = 1280\n\ndef f(x, max_tokens=1280):\n"
                                            "    return g(x, retries=1280)\n")
    assert 1280 not in hard_coded_widths(tmp_path)
    small, changes = shrink_config(config, {}, tmp_path)
    assert small["hidden_size"] == 512 and not any("kept at" in c for c in changes)
    (tmp_path / "modeling_b.py").write_text("from torch import nn\n\nclass P(nn.Module):\n    def __init__(self, d):\n"
                                            "        super().__init__()\n        self.fc = nn.Linear(1280, d)\n")
    small, changes = shrink_config(config, {}, tmp_path)
    assert small["hidden_size"] == 1280
    kept = next(c for c in changes if c.startswith("hidden_size: kept at 1280"))
    assert 'modeling_b.py:6 "self.fc = nn.Linear(1280, d)"' in kept


def test_an_error_that_does_not_depend_on_the_sizes_is_not_blamed_on_the_shrink(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def build(cfg: dict[str, Any]) -> Any:
        calls.append(cfg)
        raise AssertionError("Please install einops first")

    small, changes = fit_to_constructor(build, CONFIG, {}, tmp_path)
    assert small == shrink_config(CONFIG)[0]  # the derived config: the run reports the error as it is
    assert changes[-1].startswith("the constructor fails whatever the shrunk sizes (AssertionError: Please install")
    assert len(calls) == 2  # the most and the least reduced candidate, not every back-off


def test_an_ffn_size_is_not_kept_for_a_width_that_holds_the_same_number(tmp_path: Path) -> None:
    config = {"hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 896}
    (tmp_path / "modeling_c.py").write_text("from torch import nn\n\ndef tower(hidden_dimension=896):\n"
                                            "    return nn.Conv2d(512, 896, 3)\n")
    small, changes = shrink_config(config, {}, tmp_path)
    assert small["intermediate_size"] < 896 and not any(c.startswith("intermediate_size: kept") for c in changes)
    (tmp_path / "modeling_d.py").write_text("def mlp(intermediate_dim=896):\n    return intermediate_dim\n")
    small, changes = shrink_config(config, {}, tmp_path)
    assert small["intermediate_size"] == 896
    assert any(c.startswith("intermediate_size: kept at 896") and "modeling_d.py:1" in c for c in changes)
