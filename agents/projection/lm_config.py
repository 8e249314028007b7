"""The language model's sizes from config.json, read under the spellings configs of different eras and
families use (``n_embd`` / ``hidden_size`` / ``d_model``, ``multi_query_group_num`` / ``num_key_value_heads``,
...). Nested configs are read the way remote code nests them: the language level (``language_config``,
``text_config``, ``llm_config``) wins over the top level; a per-layer list (``moe_topk: [8, 8, ...]``) reads as
its largest value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LM_LEVELS = ("language_config", "text_config", "llm_config", "language_model_config")
VISION_LEVELS = ("vision_config", "visual", "vision_tower_config", "vit_config", "image_config")

HIDDEN = ("hidden_size", "n_embd", "d_model", "n_embed", "model_dim", "dim")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "kv_heads", "multi_query_group_num",
            "num_query_groups")
HEAD_DIM = ("head_dim", "kv_channels", "head_size", "attention_head_dim")
FFN = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "inner_hidden_size")
VOCAB = ("vocab_size", "padded_vocab_size", "n_vocab")
EXPERTS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "moe_topk", "num_experts_per_token", "moe_k", "router_topk", "top_k")
MOE_FFN = ("moe_intermediate_size", "expert_intermediate_size")
SHARED = ("n_shared_experts", "num_shared_expert", "num_shared_experts")
MAX_LEN = ("max_position_embeddings", "seq_length", "max_seq_len", "max_sequence_length", "n_positions")


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list) and value and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return float(max(value))
    return None


def first(config: dict[str, Any], keys: tuple[str, ...]) -> tuple[float | None, str]:
    """The first key of ``keys`` with a number (or a list of numbers) in ``config``: (value, key)."""
    for k in keys:
        v = _num(config.get(k))
        if v is not None and v > 0:
            return v, k
    return None, ""


def language_level(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config dict: a nested language level with the top level's scalars under it."""
    for key in LM_LEVELS:
        if isinstance(config.get(key), dict):
            return {**{k: v for k, v in config.items() if not isinstance(v, dict)}, **config[key]}
    return dict(config)


def vision_level(config: dict[str, Any]) -> dict[str, Any] | None:
    for key in VISION_LEVELS:
        if isinstance(config.get(key), dict):
            return config[key]
    return None


@dataclass
class LmConfig:
    """What the projection reads of the language model's config; ``keys`` says which key gave each value."""

    hidden: int = 0
    layers: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    vocab: int = 0
    experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    first_dense: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_dim: int = 0
    nope_dim: int = 0
    v_head_dim: int = 0
    max_len: int = 0
    tied: bool = False
    dtype: str = ""
    image_size: int = 0
    keys: dict[str, str] = field(default_factory=dict)

    def note(self, name: str) -> str:
        return f"{self.keys[name]}={getattr(self, name)}" if self.keys.get(name) else f"{name} (not in config.json)"


def lm_config(config: dict[str, Any]) -> LmConfig:
    lm = language_level(config)
    out = LmConfig()
    for name, keys in (("hidden", HIDDEN), ("layers", LAYERS), ("heads", HEADS), ("kv_heads", KV_HEADS),
                       ("head_dim", HEAD_DIM), ("ffn", FFN), ("vocab", VOCAB), ("experts", EXPERTS),
                       ("top_k", TOP_K), ("moe_ffn", MOE_FFN), ("shared_experts", SHARED), ("max_len", MAX_LEN),
                       ("first_dense", ("first_k_dense_replace",)), ("kv_lora_rank", ("kv_lora_rank",)),
                       ("q_lora_rank", ("q_lora_rank",)), ("rope_dim", ("qk_rope_head_dim",)),
                       ("nope_dim", ("qk_nope_head_dim",)), ("v_head_dim", ("v_head_dim",))):
        value, key = first(lm, keys)
        if value is not None:
            setattr(out, name, int(value))
            out.keys[name] = key
    if not out.kv_heads and (lm.get("multi_query") is True or lm.get("multi_query_attention") is True):
        out.kv_heads, out.keys["kv_heads"] = 1, "multi_query"
    if out.heads and not out.kv_heads:
        out.kv_heads = out.heads
    if out.heads and out.hidden and not out.head_dim:
        out.head_dim = out.hidden // out.heads
    if lm.get("use_mla") is False:  # a DeepSeek-V2-style config that turns its latent attention off
        out.kv_lora_rank = 0
    out.tied = bool(lm.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    out.dtype = str(lm.get("torch_dtype") or config.get("torch_dtype") or "")
    vision = vision_level(config) or {}
    size, _ = first(vision, ("image_size", "img_size", "input_resolution"))
    out.image_size = int(size or 0)
    return out
