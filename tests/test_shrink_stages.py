"""Stage schedules (sandbox/harness/shrink_stages.py): a hierarchical tower's per-stage lists shrink together: every
stage kept, up to two blocks per stage (alternating kinds both run), the widths' ratios kept, each stage's heads
and groups dividing its width, and a width the level names once more following the last stage."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sandbox.harness.shrink import shrink_candidates, shrink_config, width_levels
from sandbox.harness.shrink_stages import divisor_at_most, shrunk_widths

DAVIT_LIKE = {"text_config": {"d_model": 1024, "encoder_layers": 12, "encoder_attention_heads": 16},
              "vision_config": {"depths": [1, 1, 9, 1], "dim_embed": [256, 512, 1024, 2048],
                                "num_heads": [8, 16, 32, 64], "num_groups": [8, 16, 32, 64],
                                "patch_size": [7, 3, 3, 3], "patch_stride": [4, 2, 2, 2], "window_size": 12,
                                "image_dim_out": 2048}}


class _Block(nn.Module):
    """One block of a stage: even blocks attend over heads, odd ones over channel groups (two kinds)."""

    def __init__(self, dim: int, heads: int, groups: int, kind: int) -> None:
        super().__init__()
        parts = heads if kind == 0 else groups
        assert dim % parts == 0, f"width {dim} not divisible by {parts}"
        self.kind, self.parts, self.proj = kind, parts, nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        y = x.view(b, n, self.parts, c // self.parts).softmax(-1).reshape(b, n, c)
        return x + self.proj(y)


class _Tower(nn.Module):
    """A tower that reads its config the way hierarchical towers do: every list indexed by stage."""

    def __init__(self, vc: dict) -> None:
        super().__init__()
        widths, self.kinds_run = vc["dim_embed"], set()
        self.downs = nn.ModuleList(nn.Linear(widths[i - 1] if i else 3, w) for i, w in enumerate(widths))
        self.stages = nn.ModuleList(
            nn.ModuleList(_Block(w, vc["num_heads"][i], vc["num_groups"][i], j % 2) for j in range(vc["depths"][i]))
            for i, w in enumerate(widths))
        self.out = nn.Linear(widths[-1], vc["image_dim_out"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for down, blocks in zip(self.downs, self.stages, strict=True):
            x = down(x)
            for block in blocks:
                self.kinds_run.add(block.kind)
                x = block(x)
        return self.out(x)


def test_a_davit_like_tower_keeps_every_stage_and_both_block_kinds_at_a_small_width() -> None:
    small, changes = shrink_config(DAVIT_LIKE)
    vc = small["vision_config"]
    assert vc["depths"] == [1, 1, 2, 1]  # the 9-block stage keeps two: both of its alternating kinds
    assert vc["dim_embed"] == [32, 64, 128, 256]  # ratios kept
    assert all(w % h == 0 and w % g == 0 for w, h, g in zip(vc["dim_embed"], vc["num_heads"], vc["num_groups"],
                                                              strict=True))
    assert vc["image_dim_out"] == 256 and vc["patch_size"] == [7, 3, 3, 3] and vc["patch_stride"] == [4, 2, 2, 2]
    assert "vision_config.depths: [1, 1, 9, 1] -> [1, 1, 2, 1] (every stage kept)" in changes
    tower = _Tower(vc)
    assert tower(torch.randn(1, 4, 3)).shape == (1, 4, 256)
    assert tower.kinds_run == {0, 1}
    assert sum(p.numel() for p in tower.parameters()) < 500_000


@pytest.mark.parametrize(("config", "lists"), [
    ({"embed_dim": 96, "depths": [2, 2, 18, 2], "num_heads": [3, 6, 12, 24], "window_size": 7},  # Swin-like
     {"depths": [2, 2, 2, 2], "embed_dim": 64, "num_heads": [2, 4, 8, 16]}),  # heads divide 64 x 2^i
    ({"hidden_sizes": [96, 192, 384, 768], "depths": [3, 3, 27, 3], "num_stages": 4},  # ConvNeXt-like
     {"depths": [2, 2, 2, 2], "hidden_sizes": [32, 64, 128, 256]}),
    ({"embed_dims": [64, 128, 320, 512], "num_heads": [1, 2, 5, 8], "depths": [3, 4, 6, 3],  # PVT-like
      "sr_ratios": [8, 4, 2, 1], "mlp_ratios": [8, 8, 4, 4]},
     {"embed_dims": [32, 64, 160, 256], "num_heads": [1, 2, 5, 8], "sr_ratios": [8, 4, 2, 1],
      "mlp_ratios": [8, 8, 4, 4]}),
])
def test_other_stage_schedules_shrink_and_leave_what_is_not_a_size(config: dict, lists: dict) -> None:
    small, _ = shrink_config(config)
    assert {k: small[k] for k in lists} == lists


def test_a_level_whose_widths_are_kept_shrinks_only_its_depths() -> None:
    assert "vision_config." in width_levels(DAVIT_LIKE)  # the back-off can keep the tower's widths
    kept = next(small for keep, small, _ in shrink_candidates(DAVIT_LIKE) if keep == frozenset({"vision_config."}))
    vc = kept["vision_config"]
    assert vc["depths"] == [1, 1, 2, 1] and vc["dim_embed"] == [256, 512, 1024, 2048]
    assert vc["num_heads"] == [8, 16, 32, 64] and vc["image_dim_out"] == 2048


def test_lists_that_are_no_stage_schedule_are_left() -> None:
    # widths per stage without a depth list (no stages known); indices, rates and kernel sizes beside depths
    config = {"hidden_sizes": [256, 512], "num_hidden_layers": 4, "out_indices": [1, 2, 3]}
    assert shrink_config(config)[0]["hidden_sizes"] == [256, 512]
    config = {"depths": [3, 3], "hidden_sizes": [256, 512], "kernel_sizes": [256, 512], "drop_path_rates": [9, 9]}
    small, _ = shrink_config(config)
    assert (small["kernel_sizes"], small["drop_path_rates"]) == ([256, 512], [9, 9])
    assert (small["depths"], small["hidden_sizes"]) == ([2, 2], [32, 64])


def test_widths_and_divisors() -> None:
    assert shrunk_widths([128, 256, 512, 1024]) == [32, 64, 128, 256]
    assert shrunk_widths([96, 192, 384, 768]) == [32, 64, 128, 256]
    assert divisor_at_most(160, 5) == 5 and divisor_at_most(64, 64) == 8
    assert divisor_at_most(40, 3) == 2 and divisor_at_most(8, 3) == 1
