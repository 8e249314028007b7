"""Performance codemods: each rewrite is run on snippets of several shapes and the rewritten code is
executed against the original (exactly equal on the CPU path; close on the fused path, which here runs
the emulator's CPU references of the torch_npu ops in place of an NPU, the one thing faked)."""

from __future__ import annotations

import re
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.fixing.codemods import CODEMODS
from agents.models import Finding, HazardCategory, Severity
from agents.policies.rule import RulePolicy
from agents.rules.h4.fused import NPU_PRELUDE, fused_rms_norm, fused_rotary_mul
from agents.rules.h4.fused_attention import fused_attention
from agents.rules.h6.codemods import vectorise_mask_loops
from agents.rules.h6.moe import moe_dense_dispatch
from sandbox.ascend_sim import fused_ops


def _load(source: str, fused: bool = False) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(compile(source, "<snippet>", "exec"), ns)
    if fused:  # stand in for an NPU: the fused path runs the emulator's CPU references
        fake = types.SimpleNamespace(**{k: getattr(fused_ops, k) for k in
                                        ("npu_rms_norm", "npu_rotary_mul", "npu_fusion_attention")})
        ns["_npuport_torch_npu"] = fake
        ns["_npuport_npu_op"] = lambda name, *tensors: True
    return ns


def _rewrite(fn: Any, source: str) -> str:
    result = fn(textwrap.dedent(source))
    assert result.changed, "expected a rewrite"
    assert result.edits
    return result.source


def _unchanged(fn: Any, source: str) -> None:
    result = fn(textwrap.dedent(source))
    assert not result.changed
    assert result.source == textwrap.dedent(source)


# ----------------------------------------------------------------------------------------------
# vectorise-mask-loops
# ----------------------------------------------------------------------------------------------

MASKS = {
    "prefix_then_causal": """
        import torch
        def build(n_img, n_q, dtype=torch.float32):
            total = n_img + n_q
            mask = torch.full((total, total), torch.finfo(dtype).min, dtype=dtype)
            for i in range(total):
                if i < n_img:
                    mask[i, :n_img] = 0
                else:
                    mask[i, : i + 1] = 0
            return mask
    """,
    "causal_nested": """
        import torch
        def build(n, m):
            mask = torch.full((n, n), float("-inf"))
            for i in range(n):
                for j in range(i + 1):
                    mask[i, j] = 0.0
            return mask[None, None]
    """,
    "window_band_bool": """
        import torch
        def build(n, w):
            blocked = torch.zeros(n, n, dtype=torch.bool)
            for q in range(n):
                for k in range(n):
                    if abs(q - k) > w or (k > q and not w > 3):
                        blocked[q, k] = True
            return blocked
    """,
    "triu_slice_elif": """
        import torch
        def build(n, m):
            neg = float("-inf")
            mask = torch.zeros((n, n + 2))
            for i in range(1, n):
                if i % 2 == 0:
                    mask[i, i + 1:] = neg
                elif 1 < i <= m:
                    mask[i, : i - 3] = -1.5
                else:
                    pass
            return mask
    """,
    "upper_nested_from_i": """
        import torch
        def build(n, m):
            mask = torch.ones(n, n)
            for i in range(n):
                for j in range(i + 1, m):
                    mask[i, j] = 0
            return mask
    """,
}


@pytest.mark.parametrize("shape", sorted(MASKS))
@pytest.mark.meaning("vectorise-mask-loops")
def test_mask_loop_vectorised_is_exact(shape: str) -> None:
    src = textwrap.dedent(MASKS[shape])
    new = _rewrite(vectorise_mask_loops, src)
    assert not re.search(r"^\s+for ", new.split("def build", 1)[1], re.M), "the loop is gone"
    old_fn, new_fn = _load(src)["build"], _load(new)["build"]
    for args in [(5, 3), (8, 2), (1, 0), (6, 6)]:
        a, b = old_fn(*args), new_fn(*args)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b), (shape, args)


@pytest.mark.parametrize("body", [
    "mask[i, j] = float(i)",                  # value depends on the position
    "mask[i, j] = mask[i - 1, j]",            # a recurrence over the tensor itself
    "mask[i, j] = torch.rand(())",            # side effects
    "mask[i][j] = 0",                         # chained indexing
    "mask[i, j] += 1",                        # augmented assignment
    "mask[j, i] = 0\n        mask[i, j] = 0",  # inconsistent axes
])
def test_mask_loop_not_understood_is_left_alone(body: str) -> None:
    src = f"""
import torch
def build(n):
    mask = torch.zeros(n, n)
    for i in range(n):
      for j in range(n):
        {body}
    return mask
"""
    _unchanged(vectorise_mask_loops, src)


@pytest.mark.parametrize("src", [
    # the tensor came from outside: its shape, dtype and aliasing are unknown here
    "import torch\ndef f(mask, n):\n    for i in range(n):\n        mask[i, :i] = 0\n    return mask\n",
    # the loop variable is read after the loop
    "import torch\ndef f(n):\n    m = torch.zeros(n, n)\n    for i in range(n):\n        m[i, :i] = 1\n    "
    "return m, i\n",
    # a random condition (like a sample-image generator): not a pure function of the positions
    "import torch\ndef f(n, g):\n    m = torch.zeros(n, n)\n    for i in range(n):\n        if torch.rand((), "
    "generator=g) < 0.5:\n            m[i, :2] = 1\n    return m\n",
    # a loop that does something else too
    "import torch\ndef f(n):\n    m = torch.zeros(n, n)\n    c = 0\n    for i in range(n):\n        m[i, :i] = 1\n"
    "        c += 1\n    return m\n",
    # a start that may be negative (negative indices wrap)
    "import torch\ndef f(n, s):\n    m = torch.zeros(n, n)\n    for i in range(s, n):\n        m[i, :i] = 1\n    "
    "return m\n",
])
def test_mask_loop_unsafe_shapes_are_left_alone(src: str) -> None:
    _unchanged(vectorise_mask_loops, src)


def test_mask_fill_handles_extra_trailing_dims() -> None:
    src = textwrap.dedent("""
        import torch
        def build(n, h):
            m = torch.zeros(n, n, h)
            for i in range(n):
                m[i, i:] = 2.0
            return m
    """)
    new = _rewrite(vectorise_mask_loops, src)
    assert torch.equal(_load(src)["build"](5, 3), _load(new)["build"](5, 3))


# The index-tensor form (a class of code: a mask built per sample from token kinds, positions from
# nonzero, one row at a time): full attention among the first kind, the second kind sees all of the first
# and the second causally. Names and shapes are this test's own.
ROW_MASK = """
import torch


def kinds_mask(kinds, neg=-1e4):
    out = []
    for s in range(kinds.shape[0]):
        grid = torch.full((kinds.shape[1], kinds.shape[1]), neg)
        a_pos = (kinds[s] == 0).nonzero(as_tuple=True)[0]
        b_pos = (kinds[s] == 1).nonzero(as_tuple=True)[0]
        if len(a_pos) > 0:
            grid[a_pos[:, None], a_pos] = 0.0
        for j, row in enumerate(b_pos):
            if len(a_pos) > 0:
                grid[row, a_pos] = 0.0
            grid[row, b_pos[SLICE]] = 0.0
        out.append(grid)
    return torch.stack(out)
"""


@pytest.mark.parametrize("sl", [":j+1", ":j", "j:", "j + 2:", "1 + j:j + 3"])
def test_row_mask_loop_over_index_tensor_is_vectorised_and_exact(sl: str) -> None:
    src = ROW_MASK.replace("SLICE", sl)
    result = vectorise_mask_loops(src)
    assert result.changed and "row-by-row fill" in result.edits[0]
    new = result.source
    assert not re.search(r"^\s*for j, row in enumerate", new, re.M)
    assert "def _npuport_fill_pairs(" in new
    assert "def _npuport_span(" not in new and "def _npuport_fill(" not in new  # only the helper it calls
    old_fn, new_fn = _load(src)["kinds_mask"], _load(new)["kinds_mask"]
    g = torch.Generator().manual_seed(1)
    for kinds in [torch.cat([torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)], 1),
                  torch.randint(0, 2, (3, 9), generator=g), torch.ones(1, 4, dtype=torch.long),
                  torch.zeros(1, 3, dtype=torch.long), torch.randint(0, 3, (2, 7), generator=g)]:
        assert torch.equal(new_fn(kinds), old_fn(kinds)), (sl, kinds)


@pytest.mark.parametrize("change", [
    ("grid[row, b_pos[SLICE]] = 0.0", "grid[row, b_pos[:j + 1]] = 1.0"),  # two values: write order matters
    ("grid[row, b_pos[SLICE]] = 0.0", "grid[row, b_pos[:j - 1]] = 0.0"),  # negative bound: Python wraps
    ("grid[row, b_pos[SLICE]] = 0.0", "grid[row, b_pos[:j + 1]] = grid[row, 0]"),  # reads the tensor
    ("        out.append(grid)", "        out.append(grid)\n        print(j)"),  # loop variable used after
    ("grid[row, b_pos[SLICE]] = 0.0", "grid[row, b_pos[:j + 1]] = 0.0\n            b_pos = b_pos[1:]"),
])
def test_row_mask_loops_not_understood_are_left_alone(change: tuple[str, str]) -> None:
    _unchanged(vectorise_mask_loops, ROW_MASK.replace(*change).replace("SLICE", ":j+1"))


# ----------------------------------------------------------------------------------------------
# moe-dense-dispatch
# ----------------------------------------------------------------------------------------------

MOE_INDEX_ADD = """
import numpy as np
import torch
import torch.nn as nn


class MoE(nn.Module):
    def __init__(self, n, d, k):
        super().__init__()
        self.n_routed_experts = n
        self.top_k = k
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
                                     for _ in range(n))

    @torch.no_grad()
    def moe_infer(self, x, topk_idx, topk_weight):
        flat_idx = topk_idx.view(-1).cpu().numpy()
        flat_weight = topk_weight.view(-1)
        tokens_per_expert = topk_idx.view(-1).bincount(minlength=self.n_routed_experts)
        out = torch.zeros_like(x)
        for e in range(self.n_routed_experts):
            if tokens_per_expert[e].item() == 0:
                continue
            slots = torch.from_numpy(np.nonzero(flat_idx == e)[0])
            token_ids = slots // self.top_k
            expert_out = self.experts[e](x[token_ids])
            out.index_add_(0, token_ids, expert_out * flat_weight[slots].unsqueeze(-1).to(x.dtype))
        return out
"""

# The sorted-tokens form: argsort by expert, per-expert slices sized on the host, outputs put back
# in slot order, weighted and summed over the top-k slots.
MOE_SORTED = """
import torch
import torch.nn as nn


class MoE(nn.Module):
    def __init__(self, n, d, k):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(n))

    def moe_infer(self, x, topk_ids, topk_weight):
        cnts = topk_ids.new_zeros((topk_ids.shape[0], len(self.experts)))
        cnts.scatter_(1, topk_ids, 1)
        tokens_per_expert = cnts.sum(dim=0)
        idxs = topk_ids.view(-1).argsort()
        sorted_tokens = x[idxs // topk_ids.shape[1]]
        tokens_per_expert = tokens_per_expert.cpu().numpy()
        outputs = []
        start_idx = 0
        for i, num_tokens in enumerate(tokens_per_expert):
            end_idx = start_idx + num_tokens
            if num_tokens == 0:
                continue
            expert = self.experts[i]
            outputs.append(expert(sorted_tokens[start_idx:end_idx]))
            start_idx = end_idx
        outs = torch.cat(outputs, dim=0)
        new_x = torch.empty_like(outs)
        new_x[idxs] = outs
        return (new_x.view(*topk_ids.shape, -1).type(topk_weight.dtype).mul_(topk_weight.unsqueeze(dim=-1))
                .sum(dim=1).type(new_x.dtype))
"""


def _route(tokens: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 16, generator=g)
    scores = torch.randn(tokens, n, generator=g).softmax(-1)
    w, idx = torch.topk(scores, k, dim=-1, sorted=False)
    return x, idx, w


# The counts-list form: the loop runs over per-expert counts (a list from .tolist(), not named after experts)
# and calls self.experts[e] in its body.
MOE_COUNTS = MOE_SORTED.replace(
    "        tokens_per_expert = tokens_per_expert.cpu().numpy()\n",
    "        counts = tokens_per_expert.tolist()\n").replace(
    "for i, num_tokens in enumerate(tokens_per_expert):", "for i, num_tokens in enumerate(counts):")


def _guarded_branch(new: str) -> str:
    """The dense branch the rewrite puts before the original body of moe_infer."""
    body = new.split("def moe_infer", 1)[1]
    head, call = body.split("return _npuport_moe_dense(", 1)
    return head + call.split("\n", 1)[0]


def _counted(mod: torch.nn.Module) -> list[int]:
    """Rows each expert call sees, in call order (a forward hook on every expert)."""
    rows: list[int] = []
    for e in mod.experts:
        e.register_forward_hook(lambda _m, args, _out: rows.append(int(args[0].shape[0])))
    return rows


# (experts, top-k, tokens): with the default R = 4, dense runs when experts <= 4 * top-k.
DENSE_SIDE = [(4, 2, 7), (5, 3, 12), (8, 2, 5)]  # 8 == 4 * 2: the bound itself is dense
ORIGINAL_SIDE = [(6, 1, 3), (9, 2, 6), (16, 2, 9)]


@pytest.mark.parametrize("src,order", [(MOE_INDEX_ADD, "expert"), (MOE_SORTED, "slot"), (MOE_COUNTS, "slot")])
@pytest.mark.meaning("moe-dense-dispatch")
def test_moe_dense_dispatch_matches_on_both_sides_of_the_cost_guard(src: str, order: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPUPORT_MOE_DENSE_MAX_RATIO", raising=False)
    result = moe_dense_dispatch(src)
    assert result.changed
    assert "dense when experts <= R x top-k" in result.edits[0]
    assert "otherwise the original host-synced loop runs" in result.edits[0]
    new = result.source
    dense = _guarded_branch(new)
    assert "len(self.experts) <= _npuport_moe_dense_ratio() * " in dense
    for sync in (".item()", ".cpu()", ".numpy()", ".tolist()"):
        assert sync not in dense
    assert not re.search(r"^\s+for ", dense, re.M)
    assert f'"{order}"' in dense
    old_mod, new_mod = _load(src)["MoE"], _load(new)["MoE"]
    for n, k, tokens in DENSE_SIDE + ORIGINAL_SIDE:
        torch.manual_seed(0)
        a = old_mod(n, 16, k).eval()
        b = new_mod(n, 16, k).eval()
        b.load_state_dict(a.state_dict())
        rows = _counted(b)
        x, idx, w = _route(tokens, n, k, seed=n + k)
        with torch.no_grad():
            torch.testing.assert_close(b.moe_infer(x, idx, w), a.moe_infer(x, idx, w), rtol=1e-6, atol=1e-6)
        if (n, k, tokens) in DENSE_SIDE:  # every expert once, on every token
            assert rows == [tokens] * n
        else:  # the original loop: only the routed experts, on their tokens (tokens * k rows in all)
            assert sum(rows) == tokens * k and len(rows) == len(set(idx.flatten().tolist()))


@pytest.mark.meaning("moe-dense-dispatch")
def test_moe_dense_ratio_is_read_when_the_patched_code_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    new = _rewrite(moe_dense_dispatch, MOE_SORTED)
    old_mod, new_mod = _load(MOE_SORTED)["MoE"], _load(new)["MoE"]
    n, k, tokens = 16, 2, 9  # ratio 8: the original by default
    torch.manual_seed(0)
    a, b = old_mod(n, 16, k).eval(), new_mod(n, 16, k).eval()
    b.load_state_dict(a.state_dict())
    rows = _counted(b)
    x, idx, w = _route(tokens, n, k, seed=5)
    for ratio, dense in [("8", True), ("7.5", False), ("not-a-number", False)]:
        monkeypatch.setenv("NPUPORT_MOE_DENSE_MAX_RATIO", ratio)
        rows.clear()
        with torch.no_grad():
            torch.testing.assert_close(b.moe_infer(x, idx, w), a.moe_infer(x, idx, w), rtol=1e-6, atol=1e-6)
        assert (rows == [tokens] * n) is dense, ratio


def test_moe_loop_over_counts_is_found_and_a_capacity_cap_is_left_with_the_reason() -> None:
    from agents.reading.scanner import scan_source

    loops = [f for f in scan_source(MOE_COUNTS, "moe.py") if f.rule == "per-expert-loop"]
    assert len(loops) == 1 and loops[0].fixable and loops[0].snippet == "for i, num_tokens in enumerate(counts):"
    capped = MOE_COUNTS.replace("outputs.append(expert(sorted_tokens[start_idx:end_idx]))",
                                "outputs.append(expert(sorted_tokens[start_idx:min(end_idx, start_idx + 4)]))")
    result = moe_dense_dispatch(capped)
    assert not result.changed
    assert "caps the tokens each expert takes (`min(end_idx, start_idx + 4)`)" in result.skipped[0]
    (loop,) = [f for f in scan_source(capped, "moe.py") if f.rule == "per-expert-loop"]
    assert not loop.fixable and "caps the tokens" in loop.message
    # A loop over something else that does not call self.<experts>[i] is not an expert loop.
    plain = "class M:\n    def f(self, xs):\n        for i, n in enumerate(xs):\n            self.layers[i](n)\n"
    assert not [f for f in scan_source(plain, "m.py") if f.rule == "per-expert-loop"]


def test_moe_config_finding_names_the_path_the_full_size_config_takes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from agents.reading.scanner import scan_tree
    from agents.report.bundle import finding_resolutions
    from agents.rules.registry import active

    monkeypatch.delenv("NPUPORT_MOE_DENSE_MAX_RATIO", raising=False)
    # The shapes of a multimodal MoE config: the counts in a nested language sub-config.
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "vl", "vision_config": {"width": 768, "layers": 12},
         "language_config": {"hidden_size": 1280, "n_routed_experts": 64, "num_experts_per_tok": 6}}, indent=1))
    sub = tmp_path / "small"
    sub.mkdir()
    (sub / "config.json").write_text(json.dumps({"num_local_experts": 8, "top_k": 2, "d_model": 32}))
    (tmp_path / "other.json").write_text(json.dumps({"num_experts": 64, "moe_top_k": 2}))  # not a config.json

    def cost_findings() -> list[Finding]:
        return [f for f in scan_tree(tmp_path).findings if f.rule == "moe-dispatch-cost"]

    big, small = cost_findings()
    assert (big.file, small.file) == ("config.json", "small/config.json")
    key_line = next(i for i, ln in enumerate((tmp_path / "config.json").read_text().splitlines(), 1)
                    if '"n_routed_experts"' in ln)
    assert big.line == key_line and big.snippet == '"n_routed_experts": 64,' and not big.fixable
    assert "`language_config.n_routed_experts`" in big.message
    assert ("64 experts, top-6: the original host-synced loop runs (dense would be 10.7x the routed experts' FLOPs, "
            "above R = 4") in big.message
    assert "a --shrink run (4 experts, top-2) takes the dense path instead" in big.message
    assert "8 experts, top-2: the dense path runs (4.0x the routed experts' FLOPs, within R = 4" in small.message
    # The same pair at the top level too (as some releases repeat the language config there): one finding,
    # at the top-level key's line.
    (sub / "config.json").write_text('{"language_config": {"num_local_experts": 8, "top_k": 2},\n'
                                     ' "num_local_experts": 8,\n "top_k": 2}')
    big, small = cost_findings()
    assert small.line == 2 and "`num_local_experts`" in small.message
    monkeypatch.setenv("NPUPORT_MOE_DENSE_MAX_RATIO", "11")
    big, small = cost_findings()
    assert "64 experts, top-6: the dense path runs (10.7x" in big.message and "--shrink" not in big.message
    # Information for the person: never handed to a patcher, and the report says it is information.
    assert active().get("H6").reports_only("moe-dispatch-cost")  # type: ignore[union-attr]
    res = finding_resolutions([big.model_dump(mode="json")], [], "validated")
    assert res[big.id].startswith("left as written: information: which MoE dispatch runs is decided when the code runs")


# The expert-parallel form (a class of code: experts sharded over ranks): the loop indexes the rank's experts
# with an offset, counts come to the host with .cpu().numpy(), and a branch exchanges tokens with
# collectives. Offsets, branch condition and the None experts of other ranks are this module's own.
MOE_EP = """
import torch
import torch.nn as nn
import torch.distributed as dist


class MoE(nn.Module):
    def __init__(self, n, d, k, ranks=1, rank=0):
        super().__init__()
        self.world = ranks
        self.rank = rank
        self.per_rank = n // ranks
        self.experts = nn.ModuleList(
            nn.Linear(d, d) if rank * self.per_rank <= i < (rank + 1) * self.per_rank else None for i in range(n))

    @torch.no_grad()
    def moe_infer(self, x, topk_ids, topk_weight):
        cnts = topk_ids.new_zeros((topk_ids.shape[0], len(self.experts)))
        cnts.scatter_(1, topk_ids, 1)
        tokens_per_expert = cnts.sum(dim=0)
        idxs = topk_ids.view(-1).argsort()
        sorted_tokens = x[idxs // topk_ids.shape[1]]
        if self.world > 1:
            dist.all_to_all_single(tokens_per_expert.clone(), tokens_per_expert)
            tokens_per_expert = tokens_per_expert.view(self.world, -1)[self.rank]
        tokens_per_expert = tokens_per_expert.cpu().numpy()
        outputs = []
        start_idx = 0
        for i, num_tokens in enumerate(tokens_per_expert):
            end_idx = start_idx + num_tokens
            if num_tokens == 0:
                continue
            expert = self.experts[i + self.rank * self.per_rank]
            outputs.append(expert(sorted_tokens[start_idx:end_idx]))
            start_idx = end_idx
        outs = torch.cat(outputs, dim=0) if len(outputs) else sorted_tokens.new_empty(0)
        new_x = torch.empty_like(outs)
        new_x[idxs] = outs
        return (new_x.view(*topk_ids.shape, -1).type(topk_weight.dtype).mul_(topk_weight.unsqueeze(dim=-1))
                .sum(dim=1).type(new_x.dtype))
"""


def test_moe_offset_indexed_expert_parallel_loop_is_rewritten_under_a_guard() -> None:
    result = moe_dense_dispatch(MOE_EP)
    assert result.changed
    assert "guarded by `not (self.world > 1) and (self.rank * self.per_rank) == 0 and None not in self.experts " \
           "and len(self.experts) <= _npuport_moe_dense_ratio() * topk_ids.shape[-1]`" in result.edits[0]
    new = result.source
    guard = new.split("def moe_infer", 1)[1].split("cnts =", 1)[0]
    assert "return _npuport_moe_dense(self.experts, x, topk_ids, topk_weight, \"slot\")" in guard
    assert ".cpu()" not in guard and ".numpy()" not in guard
    old_mod, new_mod = _load(MOE_EP)["MoE"], _load(new)["MoE"]
    for n, k, tokens in [(4, 2, 7), (8, 3, 1), (6, 1, 12)]:
        torch.manual_seed(0)
        a, b = old_mod(n, 16, k).eval(), new_mod(n, 16, k).eval()
        b.load_state_dict(a.state_dict())
        x, idx, w = _route(tokens, n, k, seed=tokens)
        torch.testing.assert_close(b.moe_infer(x, idx, w), a.moe_infer(x, idx, w), rtol=1e-6, atol=1e-6)
    # Not single-device (another rank's experts are None, or the offset is not 0): the original code runs.
    calls: list[str] = []
    ns = _load(new)
    ns["_npuport_moe_dense"] = lambda *a: calls.append("dense")
    mod = ns["MoE"](4, 16, 2, ranks=1, rank=0)
    mod.rank, mod.per_rank = 1, 2  # offset 2; world 1, so no collective runs
    mod.experts = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(4)])
    x, idx, w = _route(5, 2, 2, seed=3)
    mod.moe_infer(x, idx, w)
    mod.rank = 0
    mod.experts[3] = None
    mod.moe_infer(x, idx, w)
    assert calls == []


def test_moe_collectives_outside_a_simple_branch_are_left_with_the_reason() -> None:
    from agents.rules.h6.moe import moe_plan

    src = MOE_EP.replace("        if self.world > 1:\n            dist.all_to_all_single(tokens_per_expert.clone(), "
                         "tokens_per_expert)\n",
                         "        if self.world > 1:\n            pass\n        "
                         "dist.all_to_all_single(tokens_per_expert.clone(), tokens_per_expert)\n        if "
                         "self.world > 1:\n")
    _unchanged(moe_dense_dispatch, src)
    fn = next(n for n in __import__("libcst").parse_module(src).body[3].body.body
              if getattr(n, "name", None) is not None and n.name.value == "moe_infer")
    why = moe_plan(fn)
    assert isinstance(why, str) and "collectives" in why and "all_to_all_single" in why


@pytest.mark.parametrize("change", [
    ("expert_out = self.experts[e](x[token_ids])", "expert_out = self.experts[e * 2](x[token_ids])"),
    ("expert_out = self.experts[e](x[token_ids])", "expert_out = self.experts[e + self.pick(e)](x[token_ids])"),
    ("out.index_add_(0, token_ids, ", "out.scatter_add_(0, token_ids[:, None].expand(-1, x.shape[1]), "),
    ("def moe_infer(self, x, topk_idx, topk_weight):", "def moe_infer(self, x, topk_idx, topk_weight, extra=None):"),
])
def test_moe_shapes_not_understood_are_left_alone(change: tuple[str, str]) -> None:
    _unchanged(moe_dense_dispatch, MOE_INDEX_ADD.replace(*change))


# ----------------------------------------------------------------------------------------------
# fused-rms-norm
# ----------------------------------------------------------------------------------------------

RMS = {
    "inline": """
        import torch
        def norm(x, weight, eps=1e-6):
            dtype = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return weight * x.to(dtype)
    """,
    "variance_variable": """
        import torch
        def norm(hidden_states, weight, eps=1e-6):
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + eps)
            return weight * hidden_states
    """,
    "function_forms": """
        import torch
        def norm(x, weight, eps=1e-5):
            return weight * (torch.rsqrt(eps + torch.mean(x * x, dim=-1, keepdim=True)) * x)
    """,
}


@pytest.mark.parametrize("shape", sorted(RMS))
@pytest.mark.meaning("fused-rms-norm")
def test_rms_norm_fallback_exact_and_fused_close(shape: str) -> None:
    src = textwrap.dedent(RMS[shape])
    new = _rewrite(fused_rms_norm, src)
    assert "_npuport_rms_norm(" in new and "rsqrt(variance" not in new
    assert "variance =" not in new  # the mean-of-squares variable had no other reader
    x, w = torch.randn(2, 5, 32), torch.randn(32)
    ref = _load(src)["norm"](x, w)
    assert torch.equal(_load(new)["norm"](x, w), ref)
    torch.testing.assert_close(_load(new, fused=True)["norm"](x, w), ref)


def test_rms_norm_other_statistics_left_alone() -> None:
    _unchanged(fused_rms_norm,
               "import torch\ndef f(x, y):\n    return x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)\n")
    _unchanged(fused_rms_norm,
               "import torch\ndef f(x):\n    return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)\n")
    _unchanged(fused_rms_norm,
               "import torch\ndef f(x):\n    return x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6)\n")


def test_rms_norm_variance_still_read_elsewhere_is_kept() -> None:
    src = textwrap.dedent("""
        import torch
        def norm(x, eps=1e-6):
            variance = x.pow(2).mean(-1, keepdim=True)
            y = x * torch.rsqrt(variance + eps)
            return y, variance
    """)
    new = _rewrite(fused_rms_norm, src)
    assert "variance = x.pow(2)" in new
    x = torch.randn(3, 8)
    a, b = _load(src)["norm"](x), _load(new)["norm"](x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ----------------------------------------------------------------------------------------------
# fused-rotary-mul
# ----------------------------------------------------------------------------------------------

ROTARY = """
import torch

def rotate_half(x):
    {body}

def apply(q, k, cos, sin):
    cos, sin = cos[:, None, :], sin[:, None, :]
    return q * cos + rotate_half(q) * sin, (sin * rotate_half(k)) + (cos * k)
"""
HALF_BODIES = [
    "x1, x2 = x.chunk(2, dim=-1)\n    return torch.cat((-x2, x1), dim=-1)",
    "x1 = x[..., : x.shape[-1] // 2]\n    x2 = x[..., x.shape[-1] // 2 :]\n    return torch.cat((-x2, x1), dim=-1)",
]


@pytest.mark.parametrize("body", HALF_BODIES)
@pytest.mark.meaning("fused-rotary-mul")
def test_rotary_rewrite_exact_and_fused_close(body: str) -> None:
    src = ROTARY.format(body=body)
    new = _rewrite(fused_rotary_mul, src)
    assert new.count("_npuport_rotary_mul(") == 3  # two uses + the helper
    q, k = torch.randn(2, 6, 4, 8), torch.randn(2, 6, 4, 8)
    cos, sin = torch.randn(6, 8).cos(), torch.randn(6, 8).sin()
    ref = _load(src)["apply"](q, k, cos, sin)
    for got in (_load(new)["apply"](q, k, cos, sin), _load(new, fused=True)["apply"](q, k, cos, sin)):
        torch.testing.assert_close(got, ref, rtol=0, atol=0)


def test_rotary_with_interleaved_rotation_left_alone() -> None:
    body = "return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)"
    _unchanged(fused_rotary_mul, ROTARY.format(body=body))


# ----------------------------------------------------------------------------------------------
# fused-attention
# ----------------------------------------------------------------------------------------------

ATTENTION = {
    "relpos_chain": """
        import torch
        def attend(q, k, v, table, scale):
            attn = (q * scale) @ k.transpose(-2, -1)
            bias = table.permute(2, 0, 1).unsqueeze(0)
            attn = attn + bias
            attn = attn.softmax(dim=-1)
            out = (attn @ v).transpose(1, 2)
            return out
    """,
    "divide_and_mask": """
        import math
        import torch
        def attend(q, k, v, mask, scale):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask
            return (scores.softmax(dim=-1) @ v).transpose(1, 2)
    """,
    "float32_softmax_cast": """
        import torch
        import torch.nn.functional as F
        def attend(q, k, v, mask, scale):
            s = q.shape[2]
            causal = torch.full((s, s), float("-inf"), dtype=q.dtype).triu(1)
            scores = torch.matmul(q, k.mT) * scale + causal
            out = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
            return out
    """,
}


@pytest.mark.parametrize("shape", sorted(ATTENTION))
@pytest.mark.meaning("fused-attention")
def test_attention_rewrite_exact_and_fused_close(shape: str) -> None:
    src = textwrap.dedent(ATTENTION[shape])
    new = _rewrite(fused_attention, src)
    body = new.split("def attend", 1)[1]
    assert "_npuport_attention(" in body and "softmax" in body  # the original lives on as the fallback
    g = torch.Generator().manual_seed(1)
    b, h, s, d = 2, 3, 6, 8
    q, k, v = (torch.randn(b, h, s, d, generator=g) for _ in range(3))
    table = torch.randn(s, s, h, generator=g)
    mask = torch.zeros(s, s).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    extra = table if shape == "relpos_chain" else mask
    ref = _load(src)["attend"](q, k, v, extra, d**-0.5)
    assert torch.equal(_load(new)["attend"](q, k, v, extra, d**-0.5), ref)
    torch.testing.assert_close(_load(new, fused=True)["attend"](q, k, v, extra, d**-0.5), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("src", [
    # the probabilities are returned too: they must stay materialised
    "import torch\ndef f(q, k, v):\n    p = (q @ k.transpose(-2, -1)).softmax(dim=-1)\n    return p @ v, p\n",
    # softmax over another dim is not attention
    "import torch\ndef f(q, k, v):\n    return (q @ k.transpose(-2, -1)).softmax(dim=1) @ v\n",
    # k rebound between the scores and their use: folding would read the new k
    "import torch\ndef f(q, k, v):\n    s = q @ k.transpose(-2, -1)\n    k = k * 2\n    return s.softmax(-1) @ v + k\n",
])
def test_attention_shapes_not_understood_are_left_alone(src: str) -> None:
    _unchanged(fused_attention, src)


def test_fused_attention_falls_back_when_shapes_do_not_suit() -> None:
    src = textwrap.dedent(ATTENTION["divide_and_mask"])
    new = _rewrite(fused_attention, src)
    q, k, v = torch.randn(3, 5, 8), torch.randn(3, 5, 8), torch.randn(3, 5, 8)  # 3-D: no BNSD layout
    mask = torch.zeros(5, 5)
    ref = _load(src)["attend"](q, k, v, mask, 1.0)
    assert torch.equal(_load(new, fused=True)["attend"](q, k, v, mask, 1.0), ref)


# ----------------------------------------------------------------------------------------------
# Registration and the rule policy
# ----------------------------------------------------------------------------------------------

def test_registered_and_planned_after_correctness_fixes() -> None:
    names = ["vectorise-mask-loops", "moe-dense-dispatch", "fused-rms-norm", "fused-rotary-mul", "fused-attention"]
    assert all(n in CODEMODS for n in names)

    def finding(i: int, hazard: str, rule: str) -> Finding:
        return Finding(id=f"f{i}", hazard=hazard, rule=rule, file="m.py", line=i, message="m",
                       category=HazardCategory.SLOWS_DOWN, severity=Severity.LOW)

    findings = [finding(1, "H6", "elementwise-loop"), finding(2, "H6", "per-expert-loop"),
                finding(3, "H4", "rotary-opportunity"), finding(4, "H1", "cuda-call"),
                finding(5, "H4", "rms-norm-opportunity"), finding(6, "H4", "fused-attention-opportunity")]
    planned = [a.codemod for a in RulePolicy().plan_fixes(findings)]
    assert planned[0] == "device-agnostic"
    assert planned[1:] == ["vectorise-mask-loops", "moe-dense-dispatch", "fused-rms-norm", "fused-rotary-mul",
                           "fused-attention"]


def test_rewrites_are_idempotent_on_the_example() -> None:
    from conftest import EXAMPLES

    src = (EXAMPLES / "ocr_mini" / "modeling_ocr_mini.py").read_text()
    for fn in (vectorise_mask_loops, moe_dense_dispatch, fused_rms_norm, fused_rotary_mul, fused_attention):
        once = fn(src)
        assert once.changed, fn.__name__
        again = fn(once.source)
        assert not again.changed, fn.__name__
        src = once.source
    compile(src, "modeling_ocr_mini.py", "exec")


def test_generated_broadcast_helper_agrees_with_torch() -> None:
    ns: dict[str, Any] = {}
    exec(compile(NPU_PRELUDE, "<prelude>", "exec"), ns)
    broadcast = ns["_npuport_broadcast"]
    shapes = [(), (1,), (3,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (1, 2, 1), (5, 2, 3), (2, 2)]
    for a in shapes:
        for b in shapes:
            try:
                want: tuple[int, ...] | None = tuple(torch.broadcast_shapes(a, b))
            except RuntimeError:
                want = None
            assert broadcast(torch.Size(a), b) == want, (a, b)
