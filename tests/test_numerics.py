"""msProbe-style metrics and the first diverging module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents.validation.numerics import TOLERANCES, compare_captures, tensor_metrics, within


def test_identical_tensors_are_exact() -> None:
    t = torch.randn(4, 8)
    m = tensor_metrics(t, t.clone())
    assert m["cosine"] == pytest.approx(1.0) and m["max_abs"] == 0 and m["share_over_1e3"] == 0


def test_rounding_noise_is_within_float32_tolerance_but_a_real_change_is_not() -> None:
    ref = torch.randn(1000, dtype=torch.float64)
    noisy = (ref.float()).double()  # float32 rounding of a float64 computation
    assert within(tensor_metrics(noisy, ref), TOLERANCES["float32"])
    changed = ref.clone()
    changed[:50] *= 1.01  # 5 % of the elements off by 1 %
    m = tensor_metrics(changed, ref)
    assert m["share_over_1e3"] == pytest.approx(0.05, abs=0.01)
    assert not within(m, TOLERANCES["float32"])


def test_zeros_in_both_count_as_exact_and_shape_mismatch_fails() -> None:
    z = torch.zeros(10)
    assert tensor_metrics(z, z)["share_over_1e3"] == 0
    assert tensor_metrics(torch.zeros(3), torch.zeros(4)).get("shape_mismatch") == 1.0


def test_first_diverging_module_follows_execution_order(tmp_path: Path) -> None:
    ref = {"embed": torch.ones(4), "layers.0": torch.arange(4.0), "layers.1": torch.arange(4.0) * 2,
           "__step__": torch.ones(2)}
    port = {k: v.clone() for k, v in ref.items()}
    port["layers.0"][1] += 0.5  # diverges first
    port["layers.1"][2] += 0.5
    torch.save(ref, tmp_path / "ref.pt")
    torch.save(port, tmp_path / "port.pt")
    cmp = compare_captures(tmp_path / "port.pt", tmp_path / "ref.pt", list(ref), "float32")
    assert cmp["first_diverging_module"] == "layers.0"
    assert cmp["output_within_tolerance"] and cmp["modules_compared"] == 4
