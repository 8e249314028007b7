"""``ModelCost`` from config arithmetic: the fallback where the model cannot be built on the meta device (its
code needs an environment that is not built, or a constructor that meta tensors cannot run). The shapes are
the standard ones a config's keys imply (a gated MLP where the activation is SiLU, the DeepSeek-V2 latent
attention where ``kv_lora_rank`` is set); what the model's own code does differently is not seen, and the
cost's ``source`` says so."""

from __future__ import annotations

from typing import Any

from agents.projection.cost import EncoderCost, LayerKind, ModelCost
from agents.projection.lm_config import LmConfig, first, language_level, lm_config, vision_level

GATED_ACTS = ("silu", "swiglu", "swish", "geglu")


def _attention(c: LmConfig) -> LayerKind:
    h, heads, layers = c.hidden, c.heads, c.layers
    if c.kv_lora_rank:
        qk = (c.nope_dim or c.head_dim) + c.rope_dim
        v = c.v_head_dim or c.head_dim
        q = h * c.q_lora_rank + c.q_lora_rank * heads * qk if c.q_lora_rank else h * heads * qk
        per = (q + h * (c.kv_lora_rank + c.rope_dim) + c.kv_lora_rank * heads * ((c.nope_dim or c.head_dim) + v)
               + heads * v * h)
        return LayerKind(kind="attention:mla", count=layers, params=per * layers, active_params=per * layers,
                         kv_elems_per_token=(c.kv_lora_rank + c.rope_dim) * layers, kv_shardable=False,
                         attn_flops_per_ctx=(2 * heads * (c.kv_lora_rank + c.rope_dim)
                                             + 2 * heads * c.kv_lora_rank) * layers,
                         kv_heads=1, detail=f"latent KV cache: {c.note('kv_lora_rank')} + {c.note('rope_dim')}")
    kv, d = c.kv_heads or heads, c.head_dim
    per = h * heads * d + 2 * h * kv * d + heads * d * h
    kind = "attention:mha" if kv == heads else "attention:mqa" if kv == 1 else "attention:gqa"
    return LayerKind(kind=kind, count=layers, params=per * layers, active_params=per * layers,
                     kv_elems_per_token=2 * kv * d * layers, attn_flops_per_ctx=4 * heads * d * layers, kv_heads=kv,
                     detail=f"{c.note('heads')}, {c.note('kv_heads')}, head size {d}")


def _mlps(c: LmConfig, gated: bool) -> list[LayerKind]:
    mats = 3 if gated else 2
    h = c.hidden
    dense_layers = c.layers if not c.experts else min(c.first_dense, c.layers)
    out = []
    if dense_layers:
        ffn = c.ffn or 4 * h
        out.append(LayerKind(kind="mlp", count=dense_layers, params=mats * h * ffn * dense_layers,
                             active_params=mats * h * ffn * dense_layers,
                             detail=f"{'gated' if gated else 'two-matrix'} MLP of "
                                    f"{c.note('ffn') if c.ffn else '4 x hidden'}"))
    moe_layers = c.layers - dense_layers if c.experts else 0
    if moe_layers:
        width = c.moe_ffn or c.ffn or 4 * h
        expert = mats * h * width
        shared = c.shared_experts * expert
        router = h * c.experts
        top_k = c.top_k or 1
        out.append(LayerKind(kind="moe", count=moe_layers, experts=c.experts, top_k=top_k,
                             params=(c.experts * expert + shared + router) * moe_layers,
                             active_params=(top_k * expert + shared + router) * moe_layers,
                             expert_params=c.experts * expert * moe_layers,
                             detail=f"{c.note('experts')}, "
                                    f"{c.note('top_k') if c.top_k else 'top_k 1 (not in config.json)'}, "
                                    f"{c.shared_experts} shared, expert width {width}"))
    return out


def _encoder(config: dict[str, Any]) -> EncoderCost | None:
    vision = vision_level(config)
    if not vision:
        return None
    hidden, _ = first(vision, ("hidden_size", "width", "embed_dim", "d_model"))
    layers, _ = first(vision, ("num_hidden_layers", "layers", "depth", "num_layers"))
    size, _ = first(vision, ("image_size", "img_size"))
    patch, _ = first(vision, ("patch_size", "patch"))
    if not (hidden and layers and size and patch):
        return None
    ffn, _ = first(vision, ("intermediate_size", "mlp_dim"))
    params = int(layers * (4 * hidden * hidden + 2 * hidden * (ffn or 4 * hidden)))
    tokens = int((size // patch) ** 2)
    return EncoderCost(params=params, tokens_per_image=tokens, output_tokens=tokens,
                       flops_per_image=2.0 * params * tokens,
                       detail=f"config arithmetic: {int(layers)} layers of width {int(hidden)}, {tokens} patches of "
                              f"{int(patch)} px on a {int(size)} px image")


def config_cost(config: dict[str, Any], why: str) -> ModelCost:
    """The cost from config.json alone; ``why`` says why the meta build did not give it."""
    c = lm_config(config)
    if not (c.hidden and c.layers and c.heads):
        missing = [n for n in ("hidden", "layers", "heads") if not getattr(c, n)]
        return ModelCost(source=f"config arithmetic ({why}); config.json lacks {', '.join(missing)}", kinds=[],
                         notes=["nothing can be projected: the language model's sizes are not in config.json"])
    act = str(language_level(config).get("hidden_act") or language_level(config).get("activation_function") or "")
    gated = act.lower() in GATED_ACTS or any(k in language_level(config)
                                             for k in ("intermediate_size", "ffn_hidden_size"))
    kinds = [_attention(c), *_mlps(c, gated)]
    embed = c.vocab * c.hidden
    kinds.append(LayerKind(kind="embedding", count=1, params=embed, active_params=0, detail=c.note("vocab")))
    kinds.append(LayerKind(kind="output", count=1, params=0 if c.tied else embed, active_params=embed,
                           detail="tied to the embedding" if c.tied else f"{c.vocab} x {c.hidden}"))
    encoder = _encoder(config)
    notes = ["the shapes are those the config's keys imply; the model's own code is not read"]
    if vision_level(config) and encoder is None:
        notes.append("the config has a vision part whose sizes config arithmetic cannot read: the encoder's cost "
                     "per image is not projected")
    return ModelCost(source=f"config arithmetic ({why})", kinds=kinds, encoder=encoder, hidden=c.hidden,
                     layers=c.layers, vocab=c.vocab, max_len=c.max_len, tied_output=c.tied, notes=notes)
