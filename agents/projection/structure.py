"""``ModelCost`` from the model built on the meta device (the inventory of sandbox/harness/meta_inventory.py).

What each module is comes from what the code built, never from the model's name:
- the output layer is the linear layer whose output is the vocabulary; its input width is the language
  model's hidden size, and the decoder stack is the module list whose blocks work at that width;
- in a block, a module under a type named for attention is attention, one under a type named for a MoE
  (``MoE``, ``SparseMoeBlock``, ``Experts``) is a MoE layer: a list of identical sub-modules in it (or 3-D
  weights whose first dimension counts them) are its routed experts, a linear layer with one output per
  expert its router, the rest its shared experts; anything else with weights is the dense MLP;
- the KV cache a token keeps comes from the attention's projection shapes: a down-projection whose output
  an up-projection reads back (less a rotary part) is a latent (MLA) cache of that width; otherwise the key
  and value projections' widths (separate or fused with the query) divided by the head size;
- modules outside the embedding, the decoder stack and the output layer are the encoder (vision or audio),
  run once per image: its token count is the image size over the first strided convolution's stride,
  divided again by every later strided convolution.
Head counts and sizes, the experts a token activates (``num_experts_per_tok``) and the image size come from
config.json (agents/projection/lm_config.py): a module's shape does not say them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from agents.projection.cost import EncoderCost, LayerKind, ModelCost
from agents.projection.lm_config import LmConfig, lm_config

ATTENTION = re.compile(r"attn|attention", re.I)
MOE = re.compile(r"moe|sparse|experts?$|expert(?!.*mlp)", re.I)
LATENT_ROPE_MAX = 256  # a latent KV down-projection's width exceeds what its up-projection reads by the rotary part


@dataclass
class Entry:
    name: str
    type: str
    params: dict[str, list[int]]
    count: int
    raw: dict[str, Any]

    @property
    def size(self) -> int:
        """Parameters of this module (one copy)."""
        return sum(math.prod(s) for s in self.params.values())

    @property
    def weight(self) -> list[int]:
        return self.params.get("weight") or next(iter(self.params.values()), [])

    @property
    def parent(self) -> str:
        return self.name.rpartition(".")[0]

    @property
    def linear(self) -> bool:
        return len(self.weight) == 2 and "num_embeddings" not in self.raw

    @property
    def out_in(self) -> tuple[int, int]:
        w = self.weight
        return (w[0], w[1]) if len(w) == 2 else (0, 0)


@dataclass
class Block:
    """A group of identical decoder layers: the first one's entries and how many layers it stands for."""

    prefix: str
    layers: int
    entries: list[Entry] = field(default_factory=list)


def _entries(inventory: dict[str, Any]) -> list[Entry]:
    return [Entry(e["name"], e["type"], {k: list(v) for k, v in (e.get("params") or {}).items()}, int(e["count"]), e)
            for e in inventory.get("entries") or []]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _output_layer(entries: list[Entry], c: LmConfig) -> tuple[Entry | None, Entry | None]:
    """(the output layer, the token embedding): the layers whose rows are the vocabulary."""
    vocab = c.vocab
    embed = next((e for e in entries if "num_embeddings" in e.raw and (not vocab or e.raw["num_embeddings"] == vocab)),
                 None)
    outs = [e for e in entries if e.linear and e.count == 1 and (e.out_in[0] == vocab if vocab else False)]
    return (outs[-1] if outs else None), embed


def _decoder_blocks(inventory: dict[str, Any], entries: list[Entry], hidden: int) -> list[Block]:
    """The groups of the module list(s) whose layers work at the language model's hidden width."""
    best: list[Block] = []
    best_params = 0
    for lst in inventory.get("lists") or []:
        if lst.get("count", 1) != 1:
            continue  # a list inside a repeated block (experts): not a stack of layers
        blocks = [Block(g["first"], int(g["len"])) for g in lst.get("groups") or []]
        for b in blocks:
            b.entries = [e for e in entries if _under(e.name, b.prefix)]
        at_width = sum(e.size * b.layers for b in blocks for e in b.entries if hidden in e.out_in)
        if at_width > best_params:
            best, best_params = blocks, at_width
    return best


def _ancestor_types(name: str, types: dict[str, str], stop: str) -> list[tuple[str, str]]:
    """(path, type) of the module's ancestors below ``stop``, nearest first."""
    out = []
    path = name.rpartition(".")[0]
    while path and _under(path, stop) and path != stop:
        out.append((path, types.get(path, "")))
        path = path.rpartition(".")[0]
    return out


def _role(e: Entry, block: Block, types: dict[str, str], expert_lists: list[dict[str, Any]]) -> str:
    """attention | expert | router-or-shared (inside a MoE container) | mlp | other"""
    ancestors = _ancestor_types(e.name, types, block.prefix)
    if len(e.weight) == 3 or any(_under(e.name, lst["name"]) for lst in expert_lists):
        return "expert"
    if any(MOE.search(t) for _, t in ancestors):
        return "moe"
    if any(ATTENTION.search(t) for _, t in ancestors[:2]) or ATTENTION.search(e.type):
        return "attention"
    return "mlp" if e.linear else "other"


def _kv_of(att: list[Entry], c: LmConfig, hidden: int) -> tuple[str, int, int, str, bool]:
    """(kind, KV elements per token per layer, FLOPs per context token per layer, how, shardable)."""
    ins = [e for e in att if e.linear and e.out_in[1] == hidden]
    ups = [e for e in att if e.linear and e.out_in[1] != hidden]
    pairs = [(down.out_in[0] - up.out_in[1], down, up) for down in ins for up in ups
             if 0 < down.out_in[0] - up.out_in[1] <= LATENT_ROPE_MAX and down.out_in[0] < hidden
             and up.out_in[1] < hidden // 2]
    if pairs:  # the down-projection whose output an up-projection reads back, less the rotary part
        extra, down, up = min(pairs, key=lambda p: p[0])
        width = down.out_in[0]
        return ("attention:mla", width, 2 * c.heads * width + 2 * c.heads * up.out_in[1],
                f"latent KV: {down.name.rsplit('.', 1)[-1]} {hidden}->{width}, read back by "
                f"{up.name.rsplit('.', 1)[-1]} from {up.out_in[1]} (+{extra} rotary)", False)
    d, heads = c.head_dim, c.heads
    widths = [e.out_in[0] for e in ins]
    total = sum(widths)
    if any(e.out_in[0] == hidden for e in ins) and not any(e.out_in[0] == hidden for e in ups):
        total -= hidden  # the output projection reads heads x head size == hidden: it is among them
    kv2 = total / d - heads if ins and d and heads else 0
    kv = int(round(kv2 / 2)) if kv2 > 0 else 0
    if not 1 <= kv <= heads:
        kv = c.kv_heads or heads
        how = (f"projection widths {widths} do not fit {heads} heads of {d}: config.json's kv heads ({kv})" if ins
               else "no projection at the hidden width: config.json's kv heads")
    else:
        how = f"key/value projections {2 * kv * d} wide: {kv} heads of {d} (widths {widths})"
    kind = "attention:mha" if kv == heads else "attention:mqa" if kv == 1 else "attention:gqa"
    return kind, 2 * kv * d, 4 * heads * d, how, True


def _block_kinds(block: Block, c: LmConfig, hidden: int, inventory: dict[str, Any]) -> list[LayerKind]:
    types = inventory.get("types") or {}
    expert_lists = [lst for lst in inventory.get("lists") or [] if _under(lst["name"], block.prefix)
                    and lst["name"] != block.prefix and lst.get("len", 0) >= 4 and len(lst.get("groups") or []) == 1]
    roles: dict[str, list[Entry]] = {}
    for e in block.entries:
        roles.setdefault(_role(e, block, types, expert_lists), []).append(e)
    layers = block.layers
    out: list[LayerKind] = []
    att = roles.get("attention", [])
    if att:
        kind, kv, flops, how, shard = _kv_of(att, c, hidden)
        p = sum(e.size * e.count for e in att)
        out.append(LayerKind(kind=kind, count=layers, params=p, active_params=p, kv_elems_per_token=kv * layers,
                             attn_flops_per_ctx=flops * layers, kv_shardable=shard,
                             kv_heads=kv // max(2 * c.head_dim, 1),
                             detail=f"{types.get(att[0].parent, att[0].parent)}: {how}"))
    experts = roles.get("expert", [])
    if experts:
        n = _expert_count(experts, expert_lists, c)
        expert_p = sum(e.size * e.count for e in experts)
        rest = roles.get("moe", [])
        router = [e for e in rest if e.linear and e.out_in[0] == n]
        always = sum(e.size * e.count for e in rest)
        top_k = c.top_k or 1
        out.append(LayerKind(kind="moe", count=layers, experts=n, top_k=top_k, params=expert_p + always,
                             active_params=int(expert_p * top_k / max(n, 1)) + always, expert_params=expert_p,
                             detail=f"{n} routed experts ({experts[0].type}), "
                                    f"{c.note('top_k') if c.top_k else 'top_k 1 (config.json does not say)'} per "
                                    f"token, router {'found' if router else 'not found'}, "
                                    f"{sum(e.size * e.count for e in rest if e not in router)} shared parameters"))
    else:
        roles.setdefault("mlp", []).extend(roles.pop("moe", []))
    mlp = roles.get("mlp", [])
    if mlp:
        p = sum(e.size * e.count for e in mlp)
        out.append(LayerKind(kind="mlp", count=layers, params=p, active_params=p,
                             detail=f"{types.get(mlp[0].parent, mlp[0].parent)}: {len(mlp)} weight(s)"))
    other = roles.get("other", [])
    if other:
        p = sum(e.size * e.count for e in other)
        out.append(LayerKind(kind="other", count=layers, params=p, active_params=p, detail="norms and small weights"))
    return out


def _expert_count(experts: list[Entry], expert_lists: list[dict[str, Any]], c: LmConfig) -> int:
    fused = next((e.weight[0] for e in experts if len(e.weight) == 3), 0)
    if fused:
        return int(fused)
    lists = [lst for lst in expert_lists if any(_under(e.name, lst["name"]) for e in experts)]
    return int(max((lst["len"] for lst in lists), default=c.experts or 1))


def _merge(kinds: list[LayerKind]) -> list[LayerKind]:
    """One record per kind across the block groups (a dense first layer and 26 MoE layers stay two kinds)."""
    merged: dict[str, LayerKind] = {}
    for k in kinds:
        if k.kind not in merged:
            merged[k.kind] = k.model_copy()
            continue
        m = merged[k.kind]
        for attr in ("count", "params", "active_params", "expert_params", "kv_elems_per_token", "attn_flops_per_ctx"):
            setattr(m, attr, getattr(m, attr) + getattr(k, attr))
    return list(merged.values())


def _encoder(entries: list[Entry], image_size: int) -> EncoderCost | None:
    """The entries outside the language model, in construction order, costed per image."""
    if not entries:
        return None
    params = sum(e.size * e.count for e in entries)
    tokens = 0
    first_tokens = 0
    flops = 0.0
    for e in entries:
        stride = e.raw.get("stride")
        if isinstance(stride, list) and len(stride) >= 2 and e.raw.get("kernel_size"):
            s = stride[0] * stride[1]
            if not tokens and image_size and s > 1:
                tokens = first_tokens = (image_size // stride[0]) * (image_size // stride[1])
            elif tokens and s > 1:
                tokens = max(1, tokens // s)
        flops += 2.0 * e.size * e.count * tokens
    detail = (f"{first_tokens} patches per {image_size} px image at the first strided convolution, {tokens} "
              "handed on" if first_tokens else "no image size in config.json or no strided convolution: the "
              "encoder's cost per image is not projected")
    return EncoderCost(params=params, tokens_per_image=first_tokens, output_tokens=tokens, flops_per_image=flops,
                       detail=detail + "; its attention's quadratic part is not counted")


def structure_cost(inventory: dict[str, Any], config: dict[str, Any]) -> ModelCost | None:
    """The cost of the model the inventory describes; None when it has no output layer over the vocabulary
    (an encoder, or code the rules above do not read), and the caller falls back to config arithmetic."""
    c = lm_config(config)
    entries = _entries(inventory)
    output, embed = _output_layer(entries, c)
    head = output or embed
    if head is None:
        return None
    hidden = output.out_in[1] if output is not None else int(embed.raw.get("embedding_dim") or 0) if embed else 0
    blocks = _decoder_blocks(inventory, entries, hidden)
    if not blocks or not c.heads:
        return None
    kinds: list[LayerKind] = []
    for b in blocks:
        kinds += _block_kinds(b, c, hidden, inventory)
    kinds = _merge(kinds)
    in_lm = {id(e) for b in blocks for e in b.entries} | {id(x) for x in (output, embed) if x is not None}
    tied = bool(inventory.get("tied")) or output is None
    if embed is not None:
        kinds.append(LayerKind(kind="embedding", count=1, params=embed.size, active_params=0,
                               detail=f"{embed.type} {embed.weight}"))
    vocab_out = output.out_in[0] if output is not None else int(embed.raw.get("num_embeddings", 0)) if embed else 0
    kinds.append(LayerKind(kind="output", count=1, params=0 if tied else head.size, active_params=vocab_out * hidden,
                           detail=f"{head.type} {head.weight}" + (" (tied to the embedding)" if tied else "")))
    rest = [e for e in entries if id(e) not in in_lm]
    small = [e for e in rest if len(e.weight) <= 1]
    encoder = _encoder([e for e in rest if e not in small], c.image_size or _any_image_size(config))
    if small:
        kinds.append(LayerKind(kind="other", count=1, params=sum(e.size * e.count for e in small),
                               active_params=sum(e.size * e.count for e in small),
                               detail="final norm and small weights"))
        kinds = _merge(kinds)
    layers = sum(b.layers for b in blocks)
    notes = [f"{inventory.get('class')} built on the {inventory.get('built')}"]
    if inventory.get("stubbed"):
        notes.append("imports stubbed for the build (the forward never runs): " + ", ".join(inventory["stubbed"]))
    if inventory.get("cut"):
        notes.append("the model has more modules than the inventory lists: the counts are a lower bound")
    return ModelCost(source=f"meta build ({inventory.get('class')}, {inventory.get('built')})", kinds=kinds,
                     encoder=encoder, hidden=hidden, layers=layers, vocab=vocab_out, max_len=c.max_len,
                     tied_output=tied, notes=notes)


def _any_image_size(config: dict[str, Any]) -> int:
    """An image size anywhere in the config (a vision level under another name)."""
    stack: list[Any] = [config]
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            v = d.get("image_size")
            if isinstance(v, int) and v > 0:
                return v
            stack.extend(d.values())
    return 0
