"""Shrink invariants (issue 25, class 3; sandbox/harness/shrink.py, sandbox/harness/shrink_fit.py): key/value head
counts under every spelling keep their grouping, a level sized by a per-head size and no head count keeps it,
widths the code pairs with the hidden size keep their ratio, and a forward on meta tensors backs the shrink
off where the derived sizes break an invariant only the forward holds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sandbox.harness.shrink import shrink_config
from sandbox.harness.shrink_fit import fit_to_constructor


@pytest.mark.parametrize("kv_key", ["n_head_kv", "num_query_groups", "num_kv_heads", "kv_heads", "n_kv_heads",
                                    "num_key_value_heads", "multi_query_group_num"])
def test_kv_heads_keep_their_grouping_under_any_spelling(kv_key: str) -> None:
    config = {"hidden_size": 8192, "n_head": 128, kv_key: 8, "n_layer": 60}
    small, changes = shrink_config(config)
    assert (small["n_head"], small[kv_key]) == (4, 2)  # GQA stays GQA: 2 groups that divide 4 heads
    assert small["n_head"] % small[kv_key] == 0 and f"{kv_key}: 8 -> 2" in changes
    mqa, _ = shrink_config({**config, kv_key: 1})
    assert mqa[kv_key] == 1  # MQA stays MQA


def test_a_level_sized_by_its_head_size_keeps_it_and_paired_widths_keep_their_ratio() -> None:
    config = {"hidden_size": 2048, "attention_hidden_size": 2048, "head_size": 64, "num_hidden_layers": 24,
              "mixer_inner_dim": 4096, "vocab_size": 65536, "context_length": 4096, "rotary_dim": 2048}
    small, changes = shrink_config(config)
    assert small["head_size"] == 64 and small["hidden_size"] == 4 * 64  # heads = width / head size: 4
    assert small["attention_hidden_size"] == 256 and small["mixer_inner_dim"] == 512  # 1x and 2x the width
    # not widths: a vocabulary, a context length, a rotary size are left as written
    assert (small["vocab_size"], small["context_length"], small["rotary_dim"]) == (65536, 4096, 2048)
    assert "attention_hidden_size: 2048 -> 256" in changes


FORWARD_MODEL = '''import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.proj = nn.Linear(config["hidden_size"], config["hidden_size"])
        self.data_dependent = config.get("data_dependent", False)

    def forward(self, input_ids):
        x = self.emb(input_ids)
        if self.data_dependent and input_ids.sum().item() < 0:
            return x
        b, t, _ = x.shape
        x = x.view(b, t, -1, 96)  # the code's invariant: 96 per group, whatever the config says
        return self.proj(x.reshape(b, t, -1))
'''

CONFIG = {"vocab_size": 100, "hidden_size": 4608, "num_attention_heads": 36, "num_hidden_layers": 32}


def _model_class(tmp_path: Path) -> Any:
    (tmp_path / "modeling_fwd.py").write_text(FORWARD_MODEL)
    spec = importlib.util.spec_from_file_location("modeling_fwd", tmp_path / "modeling_fwd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("modeling_fwd", None)
    spec.loader.exec_module(module)
    return module.Model


def test_a_filter_count_equal_to_the_width_follows_it() -> None:
    """A long-convolution block sized by its filter count (``assert hidden_size % num_filters == 0 and
    num_filters <= hidden_size``): the count of a convolution's filters is a width, so when it equals the
    hidden size (or a small multiple) it keeps that ratio; a smaller filter count is no width of the level."""
    config = {"hidden_size": 4096, "num_filters": 4096, "num_attention_heads": 32, "num_layers": 32,
              "short_filter_length": 3, "hyena_filter_groups": 1}
    small, changes = shrink_config(config)
    assert small["num_filters"] == small["hidden_size"] == 512 and "num_filters: 4096 -> 512" in changes
    assert (small["short_filter_length"], small["hyena_filter_groups"]) == (3, 1)  # a length, a group count
    fewer, _ = shrink_config({**config, "num_filters": 256})
    assert fewer["num_filters"] == 256


def test_a_forward_invariant_the_constructor_does_not_hold_backs_the_shrink_off(tmp_path: Path) -> None:
    model_cls = _model_class(tmp_path)
    derived, _ = shrink_config(CONFIG)
    assert derived["hidden_size"] == 512  # 4 heads x 128: builds, but 512 is no multiple of 96
    ids = torch.zeros((1, 4), dtype=torch.long)
    with pytest.raises(RuntimeError):
        model_cls(derived)(ids)  # the real forward breaks with the derived sizes
    small, changes = fit_to_constructor(model_cls, CONFIG, {}, tmp_path)
    assert small["hidden_size"] == 4608 and small["num_hidden_layers"] == 2  # widths kept, depth shrunk
    assert changes[-1].startswith("backed off to keep (top level) as written: a forward of a short prompt "
                                  "(meta tensors) refused the smaller sizes (RuntimeError")
    assert "modeling_fwd.py:17" in changes[-1]  # the view that holds the invariant
    assert model_cls(small)(ids).shape == (1, 4, 4608)  # and the fitted config runs for real


def test_a_forward_meta_tensors_cannot_run_says_nothing_about_the_sizes(tmp_path: Path) -> None:
    config = {**CONFIG, "hidden_size": 4096, "num_attention_heads": 32, "data_dependent": True}
    (tmp_path / "modeling_fwd.py").write_text(FORWARD_MODEL.replace("-1, 96)", "-1, 64)"))
    model_cls = _model_class_reloaded(tmp_path)
    small, changes = fit_to_constructor(model_cls, config, {}, tmp_path)
    assert small["hidden_size"] == 512  # .item() on meta is no refusal (a refusal would keep 4096)
    assert not any("refused" in c or "fails whatever" in c for c in changes)


def _model_class_reloaded(tmp_path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("modeling_fwd", tmp_path / "modeling_fwd.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Model


def test_a_sampling_top_k_is_no_expert_count() -> None:
    small, _ = shrink_config({"hidden_size": 1024, "n_head": 16, "top_k": 50,
                              "moe": {"num_experts": 64, "top_k": 6, "hidden_size": 1024, "n_head": 16}})
    assert small["top_k"] == 50  # a generation setting where the level has no experts
    assert small["moe"]["top_k"] == 2 and small["moe"]["num_experts"] == 4


def test_a_forward_that_fails_with_every_size_leaves_the_derived_config(tmp_path: Path) -> None:
    (tmp_path / "modeling_fwd.py").write_text(FORWARD_MODEL.replace(
        "        x = self.emb(input_ids)\n", "        raise ValueError('You have to specify decoder inputs')\n"))
    model_cls = _model_class_reloaded(tmp_path)
    small, changes = fit_to_constructor(model_cls, CONFIG, {}, tmp_path)
    assert small == shrink_config(CONFIG)[0]  # the constructor accepted the derived sizes; the forward says nothing
    assert not any("forward" in c for c in changes)


def test_a_width_one_tower_hands_another_follows_the_level_it_equals() -> None:
    """An encoder-decoder VLM's config: the vision tower's projection_dim (and the top level's) is the text
    model's d_model, by which image features are concatenated with the text embeddings; it shrinks with it.
    A per-head or rotary size equal to it by chance does not, and two levels that shrink the same old width
    differently leave it alone."""
    config = {"projection_dim": 1024,
              "text_config": {"d_model": 1024, "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                              "encoder_ffn_dim": 4096, "encoder_layers": 12},
              "vision_config": {"dim_embed": [256, 512, 1024, 2048], "projection_dim": 1024, "rope_dim": 1024,
                                "image_size": 1024}}
    small, changes = shrink_config(config)
    new = small["text_config"]["d_model"]
    assert new < 1024 and small["vision_config"]["projection_dim"] == new and small["projection_dim"] == new
    assert "vision_config.projection_dim: 1024 -> 256 (with text_config.d_model)" in changes
    assert small["vision_config"]["rope_dim"] == 1024 and small["vision_config"]["image_size"] == 1024
    # two towers of the same width shrinking to different sizes: which one the projection joins is not known
    config["audio_config"] = {"hidden_size": 1024, "num_attention_heads": 8}
    small, _ = shrink_config(config)
    assert small["audio_config"]["hidden_size"] != small["text_config"]["d_model"]
    assert small["vision_config"]["projection_dim"] == 1024
