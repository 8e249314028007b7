"""The scan classes of issue 25 (H20-H23): legacy tuple KV caches, KV growth by torch.cat, MoE routing on
int64, and what config.json says about the checkpoint (quantisation, dtype). Each detector on positive and
negative snippets; each finding's claim checked by running the code it flags; and the real releases of
the zoo that have the class (../shared/data/zoo, read in place)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from agents.models import Finding
from agents.reading.scanner import scan_source, scan_tree
from agents.rules.context import TextFile
from agents.rules.h23_checkpoint_config import RULE as H23
from agents.rules.registry import DEFAULT

ZOO = Path(__file__).resolve().parents[2] / "shared" / "data" / "zoo"  # ../shared beside the checkout, as in CI


def scan(src: str) -> list[Finding]:
    return scan_source(textwrap.dedent(src), "m.py")


def lines(findings: list[Finding], rule: str) -> list[int]:
    return sorted(f.line for f in findings if f.rule == rule)


TUPLE_LAYER = '''
import torch

class Attention(torch.nn.Module):
    def forward(self, q, k, v, past_key_value=None, use_cache=False):
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        past_key_value = (k, v) if use_cache else None
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v, past_key_value
'''


def test_legacy_tuple_cache_is_found_once_per_layer_and_not_elsewhere() -> None:
    found = scan(TUPLE_LAYER)
    assert lines(found, "legacy-tuple-cache") == [7]  # the first read; the layer is one finding
    assert all(f.hazard == "H20" and not f.fixable for f in found if f.rule == "legacy-tuple-cache")
    other = scan("""
        def forward(self, x, cache):
            out = (x, x)          # a pair that is not a cache
            h = cache.update(x, x, 0)
            return out[0], h
    """)
    assert lines(other, "legacy-tuple-cache") == []
    assert lines(scan("def f(past_key_value):\n    present = (1, 2, 3)\n    return past_key_value.key\n"),
                 "legacy-tuple-cache") == []


def test_kv_growth_by_cat_is_found_per_concatenation() -> None:
    found = scan(TUPLE_LAYER)
    assert lines(found, "kv-cat-growth") == [7, 8]
    grown = scan("import torch\ndef f(a, b, layer_past):\n    return torch.cat([a, b], -1)\n")
    assert lines(grown, "kv-cat-growth") == []
    # a mask grown per step is not the KV cache
    assert lines(scan("import torch\ndef f(mask, past_mask):\n    return torch.cat([past_mask, mask], -1)\n"),
                 "kv-cat-growth") == []
    # concatenating onto a preallocated cache's view is not growth of the cache
    assert lines(scan("import torch\ndef f(k, cache):\n    return torch.cat([k, cache[:, :1]], 1)\n"),
                 "kv-cat-growth") == []


def _decode_with(layer_src: str, steps: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """Run a layer step by step; the cache shapes and the storage of the key cache per step."""
    ns: dict[str, object] = {}
    exec(textwrap.dedent(layer_src), ns)
    layer = ns["Attention"]()  # type: ignore[operator]
    past, shapes, storages = None, [], []
    for _ in range(steps):
        x = torch.randn(1, 2, 1, 4)
        _, past = layer(x, x, x, past, use_cache=True)
        shapes.append(tuple(past[0].shape))
        storages.append(past[0].untyped_storage().data_ptr())
    return shapes, storages


def test_the_claims_hold_when_the_flagged_layer_runs() -> None:
    """What H20 and H21 say of this layer: the cache it returns is a plain tuple (no Cache API), its shape
    changes every step (a graph cannot replay it) and every step allocates a new cache."""
    shapes, storages = _decode_with(TUPLE_LAYER, 4)
    assert shapes == [(1, 2, n, 4) for n in (1, 2, 3, 4)]
    assert len(set(storages)) == 4
    ns: dict[str, object] = {}
    exec(textwrap.dedent(TUPLE_LAYER), ns)
    _, cache = ns["Attention"]()(*(torch.randn(1, 1, 1, 2),) * 3, None, use_cache=True)  # type: ignore[operator]
    assert type(cache) is tuple and not hasattr(cache, "update")


ROUTER = '''
import torch
import torch.nn.functional as F

class MoEGate(torch.nn.Module):
    def forward(self, logits, n_experts=4):
        weights, idx = torch.topk(logits.softmax(-1), 2, dim=-1)
        mask = F.one_hot(idx, n_experts)
        counts = torch.bincount(idx.flatten(), minlength=n_experts)
        order = idx.flatten().argsort()
        return weights, idx, mask, counts, order

def helper(x):
    return F.one_hot(x, 3)
'''


def test_int64_routing_ops_are_found_in_routing_code_only() -> None:
    found = scan(ROUTER)
    assert lines(found, "int64-routing") == [8, 9, 10]
    assert all("MoEGate" in f.message and "int32" in f.message for f in found if f.rule == "int64-routing")
    ns: dict[str, object] = {}
    exec(textwrap.dedent(ROUTER), ns)
    out = ns["MoEGate"]()(torch.randn(5, 4))  # type: ignore[operator]
    assert {t.dtype for t in out[1:]} == {torch.int64}  # what the finding says: the routing is int64
    cast = scan("class Router:\n    def route(self, idx):\n        return idx.long()\n")
    assert lines(cast, "int64-routing") == [3]


def _config_findings(config: dict[str, object]) -> list[Finding]:
    text = json.dumps(config, indent=2)
    assert H23.detect_text is not None
    return H23.detect_text(TextFile("config.json", "config.json", text, DEFAULT, kind="model-config"))


def test_config_quantisation_and_checkpoint_dtype() -> None:
    gptq = _config_findings({"hidden_size": 8, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    (q,) = gptq
    assert (q.rule, q.line) == ("quantization-config", 3) and "gptq-quantised (4-bit)" in q.message
    assert "CUDA" in q.message and "--shrink" in q.message
    fp8 = _config_findings({"text_config": {"quantization_config": {"quant_method": "fp8"}, "torch_dtype": "float32"}})
    assert [f.rule for f in fp8] == ["quantization-config"]
    bf16 = _config_findings({"torch_dtype": "bfloat16"})
    assert [f.rule for f in bf16] == ["checkpoint-dtype"] and "310p" in bf16[0].message
    assert _config_findings({"torch_dtype": "float16"}) == []  # every registered chip computes float16
    assert _config_findings({"torch_dtype": "float32", "hidden_size": 8}) == []


@pytest.mark.skipif(not ZOO.is_dir(), reason="needs ../shared/data/zoo")
def test_the_zoo_releases_that_have_the_classes_are_found() -> None:
    internlm2 = scan_tree(ZOO / "internlm2-chat-7b").findings
    assert any(f.rule == "legacy-tuple-cache" and f.file == "modeling_internlm2.py" for f in internlm2)
    assert {f.line for f in internlm2 if f.rule == "kv-cat-growth"} >= {370, 371}
    molmo = scan_tree(ZOO / "molmo-7b-d-nf4").findings
    (q,) = [f for f in molmo if f.rule == "quantization-config"]
    assert q.file == "config.json" and "bitsandbytes-quantised (4-bit)" in q.message
