"""The model of the model: what one generated token, one prompt token and one image cost, by layer kind.

Counts are parameters and elements, never bytes: the dtype a deployment serves in (bf16, int8 weights,
int4 experts) turns them into bytes in agents/projection/project.py. A token's FLOPs through a layer are two
per parameter it reads (one multiply, one add); attention adds its part per token of context."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LayerKind(BaseModel):
    """One kind of layer of the language model and how many of it there are; every figure is the total over
    the ``count`` layers."""

    kind: str
    """attention:mha | attention:gqa | attention:mqa | attention:mla | mlp | moe | embedding | output | other"""
    count: int
    params: int
    """All parameters of the kind (every expert of a MoE layer), for the weights' memory."""
    active_params: int
    """Parameters one token reads (a MoE layer: the router, the shared experts and top_k of the experts)."""
    expert_params: int = 0
    """A MoE kind's routed experts, all of them (a batch of tokens touches more of them than one token)."""
    experts: int = 0
    top_k: int = 0
    kv_elems_per_token: int = 0
    """Elements of KV cache one token of context keeps, all layers of the kind together."""
    attn_flops_per_ctx: int = 0
    """FLOPs one token spends per token of context (scores and the weighted sum), all layers together."""
    kv_shardable: bool = True
    """The KV cache splits across tensor-parallel ranks (heads); a latent (MLA) cache is kept whole on each."""
    kv_heads: int = 0
    detail: str = ""
    """How it was recognised (types and shapes, or the config keys)."""


class EncoderCost(BaseModel):
    """A vision (or audio) encoder, run once per image before the language model sees its tokens."""

    params: int
    tokens_per_image: int
    """Tokens at the encoder's input (the patch grid); 0 when unknown."""
    output_tokens: int
    """Tokens the encoder hands the language model per image (after its downsampling)."""
    flops_per_image: float
    detail: str = ""


class ModelCost(BaseModel):
    source: str
    """"meta build (...)" or "config arithmetic (...)": where the figures come from."""
    kinds: list[LayerKind]
    encoder: EncoderCost | None = None
    hidden: int = 0
    layers: int = 0
    vocab: int = 0
    max_len: int = 0
    tied_output: bool = False
    notes: list[str] = Field(default_factory=list)

    def total(self, attr: str, kinds: tuple[str, ...] | None = None) -> float:
        """The sum of a per-kind total (every figure of a LayerKind covers all its ``count`` layers)."""
        return float(sum(getattr(k, attr) for k in self.kinds if kinds is None or k.kind.split(":")[0] in kinds))

    @property
    def params(self) -> int:
        """Every parameter held in memory, the encoder's included."""
        return int(self.total("params")) + (self.encoder.params if self.encoder else 0)

    @property
    def active_params(self) -> int:
        return int(self.total("active_params", ("attention", "mlp", "moe", "output", "other")))

    @property
    def kv_elems_per_token(self) -> int:
        return int(self.total("kv_elems_per_token"))

    @property
    def attn_flops_per_ctx(self) -> int:
        return int(self.total("attn_flops_per_ctx"))

    def moe_kinds(self) -> list[LayerKind]:
        return [k for k in self.kinds if k.kind == "moe"]

    def attention(self) -> LayerKind | None:
        return next((k for k in self.kinds if k.kind.startswith("attention")), None)
