"""Decoder weight layouts that one of vLLM's own classes loads (runs inside the sandbox, beside
sandbox/serving/export.py): for a model whose architecture vLLM does not know, the servable folder is its
weights renamed to the layout of a vLLM class and its config written in that class's terms.

A layout is recognised from the weights alone (names, which tensors exist), never from the model's name:

- every decoder layer has q/k/v/o projections, a gated MLP (gate/up/down, or a fused gate_up that is
  split), and a norm before attention and one before the MLP; an embedding, a final norm, and a head
  (or tied embeddings);
- the norms decide the family: weight-only norms (RMSNorm) are the Llama family, norms with a bias
  (LayerNorm) the StableLM family;
- within the Llama family the attention biases decide the class: none is Llama, q/k/v biases are
  Qwen2, q/k/v and o biases are Llama with ``attention_bias``; the StableLM family takes q/k/v biases
  (``use_qkv_bias``) but no o bias.

The config is translated key by key (:data:`SYNONYMS`: the names HF configs of different eras use for
the same quantity, e.g. ``rope_pct`` / ``partial_rotary_factor``, ``norm_eps`` / ``rms_norm_eps``).
What the weights cannot show (the rotary fraction, the activation) comes from those keys; the token
check through the server decides whether the class computes what the model computes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_ATTN = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight"}
_NORMS = {"input_layernorm.weight", "post_attention_layernorm.weight"}
_NORM_BIAS = {"input_layernorm.bias", "post_attention_layernorm.bias"}
_QKV_BIAS = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}
_O_BIAS = {"self_attn.o_proj.bias"}
_MLP = ({"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"},
        {"mlp.gate_up_proj.weight", "mlp.down_proj.weight"})
# Weights that are computed, not learned (rotary tables, causal masks): vLLM computes its own.
_COMPUTED = re.compile(r"(rotary_emb|rotary)\.(inv_freq|cos_cached|sin_cached)$|\.masked_bias$|attn\.bias$")

# One quantity, the names configs give it (the first is the name written for vLLM's class).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "num_heads", "n_head", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"),
    "norm_eps": ("rms_norm_eps", "norm_eps", "layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon"),
    "partial_rotary_factor": ("partial_rotary_factor", "rope_pct", "rotary_pct"),
    "rope_theta": ("rope_theta", "rotary_emb_base", "rotary_base"),
    "max_position_embeddings": ("max_position_embeddings", "max_seq_len", "seq_length", "n_positions"),
    "hidden_act": ("hidden_act", "activation_function"),
}
_PLAIN = ("vocab_size", "head_dim", "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id",
          "rope_scaling", "initializer_range")


@dataclass
class Layout:
    architecture: str  # the vLLM class
    model_type: str
    family: str  # "llama" | "stablelm"
    mapping: dict[str, str]  # our weight name -> its name (gate_up is split by convert)
    config: dict[str, Any] = field(default_factory=dict)  # class-specific keys (biases)
    reason: str = ""


def _prefix(names: list[str]) -> str | None:
    for name in names:
        m = re.match(r"^(.*?)layers\.\d+\.", name)
        if m:
            return m.group(1)
    return None


def decoder_layout(names: list[str]) -> Layout | None:
    """The layout of these weight names (module docstring), or None when some weight has no place in any."""
    names = [n for n in names if not _COMPUTED.search(n)]
    prefix = _prefix(names)
    if prefix is None:
        return None
    layers: dict[int, set[str]] = {}
    mapping: dict[str, str] = {}
    top: set[str] = set()
    for name in names:
        rest = name[len(prefix):] if name.startswith(prefix) else None
        if name == "lm_head.weight" or rest == "lm_head.weight":
            mapping[name] = "lm_head.weight"
        elif rest in ("embed_tokens.weight", "norm.weight", "norm.bias"):
            mapping[name] = f"model.{rest}"
            top.add(rest)
        elif rest is not None and (m := _LAYER.match(rest)):
            layers.setdefault(int(m.group(1)), set()).add(m.group(2))
            mapping[name] = f"model.{rest}"
        else:
            return None  # a weight the layout has no place for
    if not {"embed_tokens.weight", "norm.weight"} <= top or not layers or sorted(layers) != list(range(len(layers))):
        return None
    kinds = set()
    for parts in layers.values():
        if not parts >= _ATTN | _NORMS:
            return None
        mlp = parts - _ATTN - _NORMS - _NORM_BIAS - _QKV_BIAS - _O_BIAS
        if mlp not in _MLP:
            return None
        for group in (_NORM_BIAS, _QKV_BIAS):
            if parts & group and not parts >= group:
                return None  # half a set of biases: no class has that
        kinds.add((bool(parts & _NORM_BIAS), bool(parts & _QKV_BIAS), bool(parts & _O_BIAS)))
    if len(kinds) != 1:
        return None  # layers of different kinds
    norm_bias, qkv_bias, o_bias = kinds.pop()
    if norm_bias != ("norm.bias" in top):
        return None
    if norm_bias:
        if o_bias:
            return None  # vLLM's StableLM has no o_proj bias
        return Layout("StableLmForCausalLM", "stablelm", "stablelm", mapping, {"use_qkv_bias": qkv_bias},
                      "LayerNorm (weight and bias) before attention and MLP, q/k/v/o projections, a gated MLP"
                      + (", q/k/v biases" if qkv_bias else ""))
    if o_bias and not qkv_bias:
        return None
    if qkv_bias and not o_bias:
        return Layout("Qwen2ForCausalLM", "qwen2", "llama", mapping, {},
                      "RMSNorm, q/k/v/o projections with q/k/v biases, a gated MLP")
    return Layout("LlamaForCausalLM", "llama", "llama", mapping, {"attention_bias": o_bias},
                  "RMSNorm, q/k/v/o projections" + (" with biases on all four" if o_bias else "") + ", a gated MLP")


def convert(state: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """The state dict renamed to the layout (weights with no mapping, the computed ones, are left out); a
    fused gate/up projection split into gate and up (in that order, as ``chunk(2)`` splits it)."""
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        new = mapping.get(name)
        if new is None:
            continue
        if new.endswith("mlp.gate_up_proj.weight"):
            gate, up = tensor.chunk(2, dim=0)
            out[new.replace("gate_up_proj", "gate_proj")] = gate
            out[new.replace("gate_up_proj", "up_proj")] = up
        else:
            out[new] = tensor
    return out


def _pick(config: dict[str, Any], key: str) -> Any:
    return next((config[k] for k in SYNONYMS[key] if config.get(k) is not None), None)


def layout_config(config: dict[str, Any], layout: Layout, has_head: bool) -> dict[str, Any]:
    """The model's config in the terms of the layout's vLLM class."""
    out: dict[str, Any] = {k: config[k] for k in _PLAIN if config.get(k) is not None}
    for key in SYNONYMS:
        value = _pick(config, key)
        if value is not None:
            out[key] = value
    eps = out.pop("norm_eps", None)
    if eps is not None:
        out["layer_norm_eps" if layout.family == "stablelm" else "rms_norm_eps"] = eps
    out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
    out.setdefault("hidden_act", "silu")
    out["tie_word_embeddings"] = bool(out.get("tie_word_embeddings", False)) or not has_head
    if not isinstance(out.get("rope_scaling"), dict):
        out.pop("rope_scaling", None)
    out.update(layout.config)
    out.update({"architectures": [layout.architecture], "model_type": layout.model_type, "torch_dtype": "float32"})
    return out
