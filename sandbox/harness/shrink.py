"""Derive a small config from a model's config.json, and estimate a config's size.

Rules are by the CLASS of a key (a layer count, an expert count, a head count, a width), applied at
every nesting level (sub-configs such as a language or vision config). Sizes stay consistent:
hidden % heads == 0, kv heads divide heads, routed experts divisible by expert groups, top-k no
larger than the experts. The per-head size is kept (hidden = HEADS x the original hidden / heads, and
``head_dim`` keys are not shrunk): code derives head counts from widths (``num_heads = embed_dim // 128``)
and rotary sizes from the head size. Vocabulary and image sizes are kept: token ids and image tensors
built by the model's own preprocessing must stay valid. A width equal to a literal the code uses as a
size (a layer's size argument, a size-named keyword, default or variable) is kept, citing that line. A width
one level hands another (a vision tower's ``projection_dim`` equal to the language model's hidden size) follows
the level it equals. The manifest's ``shrink:`` dict (dotted keys for nested configs) overrides any derived value.
``shrink_candidates`` gives the backed-off variants (a level's widths and heads kept) that
sandbox/harness/shrink_fit.py tries when the model's constructor rejects the derived sizes.
Used by the harness (inside the sandbox), so it imports nothing of agents/graph.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.harness.shrink_code import SIZE_LAYERS, _size_name, hard_coded_widths  # noqa: F401  (re-exported)
from sandbox.harness.shrink_layers import kept_layers, kept_note, remap, shrink_periods
from sandbox.harness.shrink_stages import shrink_stages, stage_depth_keys

HEADS = 4
HEAD_DIM = 16
HIDDEN = HEADS * HEAD_DIM
INTERMEDIATE = 2 * HIDDEN
EXPERTS = 4
TOP_K = 2

_LAYER_KEYS = re.compile(r"^(num_hidden_layers|n_layers?|num_layers|layers|num_decoder_layers|num_encoder_layers|depth|"
                         r"encoder_layers|decoder_layers)$")
_EXPERT_KEYS = re.compile(r"^(n_routed_experts|num_experts|num_local_experts|moe_num_experts|n_experts)$")
_TOPK_KEYS = re.compile(r"^(num_experts_per_tok|moe_top_?k|top_k|experts_per_token)$")
_HEAD_KEYS = re.compile(r"^(num_attention_heads|n_heads?|num_heads|heads|encoder_attention_heads"
                        r"|decoder_attention_heads)$")
# Key/value head counts (GQA / MQA) under any of their spellings: num_key_value_heads, n_head_kv, kv_heads,
# num_kv_heads, multi_query_group_num, num_query_groups (a KV group per query group).
_KV_KEYS = re.compile(r"^(num_key_value_heads|(n|num)_?(kv|key_value)_?heads?|(n|num)_heads?_kv|kv_(n_)?heads|"
                      r"multi_query_group_num|num_query_groups|n_query_groups)$")
# Per-head sizes: kept as written; a level without a head count derives its heads from width / per-head size.
_PER_HEAD_KEYS = re.compile(r"^(head_dim|head_size|attention_head_size|d_head|dim_head|size_per_head|kv_channels)$")
_HIDDEN_KEYS = re.compile(r"^(hidden_size|d_model|n_embd|n_embed|embed_dim|dim|width|hidden_dim|input_dim|output_dim)$")
_FFN_KEYS = re.compile(r"^(intermediate_size|ffn_dim|ffn_hidden_size|n_inner|d_ff|encoder_ffn_dim|"
                       r"decoder_ffn_dim|moe_intermediate_size|shared_expert_intermediate_size)$")
# Expert groups (must divide the experts), groups picked per token, shared experts: one each.
_TO_ONE = ("n_group", "num_expert_group", "topk_group", "n_shared_experts", "num_shared_experts")
# Per-head sizes (head_dim, qk_rope_head_dim ...) are kept; low-rank projections shrink.
_LORA_RANK_KEYS = re.compile(r"^(kv_lora_rank|q_lora_rank)$")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shrink_config(config: dict[str, Any], overrides: dict[str, Any] | None = None,
                  model_dir: Path | None = None,
                  keep: frozenset[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:
    """A small copy of ``config`` and the list of changes ("path: old -> new"), overrides last. With
    ``model_dir``, widths the code hard-codes are kept and reported (override: the manifest's
    ``shrink:``). ``keep``: level prefixes ("" for the top, "vision_config." ...) whose widths and head
    counts stay as written (layers and experts still shrink): the backed-off variants of shrink_candidates."""
    changes: list[str] = []
    hard = hard_coded_widths(model_dir) if model_dir is not None else {}
    out = _shrink_level(config, "", changes, hard, keep)
    _cross_level_widths(config, out, changes, hard)
    for key, value in (overrides or {}).items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        original: Any = config
        for part in key.split("."):
            original = original.get(part, "<unset>") if isinstance(original, dict) else "<unset>"
        node[last] = value
        changes = [c for c in changes if not c.startswith(f"{key}:")]
        changes.append(f"{key}: {original} -> {value} (manifest shrink override)")
    return out, changes


def width_levels(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Level prefixes whose widths or heads the shrink reduces, deepest first (a vision tower's before
    the top level): the order in which shrink_fit backs them off."""
    out = [lv for k, v in config.items() if isinstance(v, dict) for lv in width_levels(v, f"{prefix}{k}.")]
    if stage_depth_keys(config) or any(_int(v) and v > 0 and (_HIDDEN_KEYS.match(k) or _HEAD_KEYS.match(k)
                                                               or _FFN_KEYS.match(k)) for k, v in config.items()):
        out.append(prefix)
    return out


def shrink_candidates(config: dict[str, Any], overrides: dict[str, Any] | None = None,
                      model_dir: Path | None = None) -> list[tuple[frozenset[str], dict[str, Any], list[str]]]:
    """(kept levels, small config, changes), most reduced first: the derived config, then one level's
    widths and heads kept at a time, then every level's (only layers and experts reduced)."""
    levels = width_levels(config)
    keeps = [frozenset(), *(frozenset({lv}) for lv in levels)]
    if len(levels) > 1:
        keeps.append(frozenset(levels))
    return [(k, *shrink_config(config, overrides, model_dir, k)) for k in keeps]


def _shrink_level(config: dict[str, Any], prefix: str, changes: list[str],
                  hard: dict[int, list[tuple[str, str | None]]] | None = None,
                  keep: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One config level shrunk (its sub-configs first), each change appended to ``changes``."""
    out = {key: _shrink_level(value, f"{prefix}{key}.", changes, hard, keep) if isinstance(value, dict) else value
           for key, value in config.items()}
    level = _Level(out, prefix, changes, hard or {}, keep_widths=prefix in keep,
                   nested_layers=_nested_layer_count(config))
    level.shrink_layers()
    level.shrink_sizes()
    level.keep_per_head_size()
    shrink_stages(out, config, prefix, changes, keep_widths=prefix in keep)
    level.shrink_groupings()
    return out


@dataclass
class _Level:
    """A config level being shrunk in place: its values, where it sits, the changes so far, the widths the
    code hard-codes, and whether its widths and heads are kept as written (a backed-off candidate)."""

    out: dict[str, Any]
    prefix: str
    changes: list[str]
    hard: dict[int, list[tuple[str, str | None]]]
    keep_widths: bool
    nested_layers: int = 0
    """The largest layer count of the level's sub-configs as written (a period a wrapper sets for them)."""
    heads_key: str | None = None
    old_heads: Any = None
    hidden_key: str | None = None
    old_hidden: Any = None
    hidden: int = 0
    """The level's shrunk width (HEADS x its per-head size)."""

    def set_(self, key: str, new: int) -> None:
        old = self.out[key]
        if _int(old) and new < old:
            self.out[key] = new
            self.changes.append(f"{self.prefix}{key}: {old} -> {new}")

    def width(self, key: str, new: int, ffn: bool = False) -> bool:
        old = self.out[key]
        kept = _kept_by_code(self.hard, self.prefix, key, old, ffn) if _int(old) else None
        if kept:
            self.changes.append(kept)
            return False
        self.set_(key, new)
        return True

    def shrink_layers(self) -> None:
        """Each layer count -> the first layer of every kind the level's config names (at least LAYERS;
        sandbox/harness/shrink_layers.py), its per-layer lists, patterns, index lists and boundaries remapped
        onto the kept layers, and its periods -> 2."""
        out = self.out
        original = dict(out)
        counts: dict[int, list[str]] = {}
        for key, v in original.items():
            if _LAYER_KEYS.match(key) and _int(v) and v > 0:
                counts.setdefault(v, []).append(key)
        for count, keys in counts.items():
            kept = kept_layers(original, count)
            if len(kept.layers) >= count:
                continue
            for key in keys:
                out[key] = len(kept.layers)
            plain = [f"{self.prefix}{k}: {count} -> {len(kept.layers)}" for k in keys]
            if kept.kinds > 1 and kept.layers != list(range(len(kept.layers))):  # which layers, of which kinds
                plain[0] = kept_note(self.prefix, keys, count, kept.layers, original, kept.rules)
            self.changes += plain
            remap(out, original, kept.rules, kept.layers, self.prefix, self.changes)
        shrink_periods(out, max(counts, default=0) or self.nested_layers, self.prefix, self.changes)

    def shrink_sizes(self) -> None:
        """Experts always; heads, hidden widths (to HEADS x the per-head size), FFN sizes, LoRA
        ranks and the widths paired with the hidden size unless the level keeps its widths."""
        out = self.out
        self.heads_key = next((k for k in out if _HEAD_KEYS.match(k) and _int(out[k])), None)
        self.old_heads = out[self.heads_key] if self.heads_key else None
        self.hidden_key = next((k for k in out if _HIDDEN_KEYS.match(k) and _int(out[k])), None)
        self.old_hidden = out[self.hidden_key] if self.hidden_key else None
        hidden = self.hidden = _per_head_hidden(out, self.heads_key, self.hidden_key)
        for key in list(out):
            v = out[key]
            if not _int(v) or v <= 0:
                continue
            if _LAYER_KEYS.match(key):
                continue  # shrink_layers
            elif _EXPERT_KEYS.match(key):
                self.set_(key, EXPERTS)
            elif self.keep_widths:
                continue
            elif _HEAD_KEYS.match(key):
                self.set_(key, HEADS)
            elif _HIDDEN_KEYS.match(key):
                self.width(key, hidden)
            elif _FFN_KEYS.match(key):
                self.width(key, 2 * hidden, ffn=True)
            elif _LORA_RANK_KEYS.match(key):
                self.width(key, HEAD_DIM)
        if self.hidden_key and isinstance(self.old_hidden, int) and out[self.hidden_key] < self.old_hidden:
            _companion_widths(out, self.hidden_key, self.old_hidden, out[self.hidden_key], self.width)

    def keep_per_head_size(self) -> None:
        """A kept (hard-coded) width keeps the heads too, so the per-head size is the model's (and divides)."""
        out, heads_key, hidden_key, old_hidden = self.out, self.heads_key, self.hidden_key, self.old_hidden
        kept_hidden = hidden_key is not None and out[hidden_key] == old_hidden and _int(old_hidden) \
            and old_hidden > self.hidden
        if heads_key and hidden_key and _int(out[heads_key]) and (out[hidden_key] % out[heads_key] or kept_hidden):
            out[heads_key] = self.old_heads
            self.changes[:] = [c for c in self.changes if not c.startswith(f"{self.prefix}{heads_key}:")]
        if self.keep_widths and any(_HIDDEN_KEYS.match(k) or _HEAD_KEYS.match(k) for k in out):
            self.changes.append(f"{self.prefix.rstrip('.') or '(top level)'}: widths and heads kept as written")

    def shrink_groupings(self) -> None:
        """What depends on the shrunk heads, layers and experts: kv heads (keeping the grouping class), the
        experts picked per token, shared experts and groups, the dense layers before the MoE ones."""
        out = self.out
        for key in list(out):
            v = out[key]
            if _KV_KEYS.match(key) and _int(v) and v > 0 and self.heads_key and not self.keep_widths:
                # Keep the grouping class: full MHA stays MHA, MQA stays MQA, GQA becomes 2 groups.
                new = out[self.heads_key] if v == self.old_heads else (1 if v == 1 else HEADS // 2)
                self.set_(key, new)
            elif _TOPK_KEYS.match(key) and _int(v) and any(_EXPERT_KEYS.match(k) and _int(out[k]) for k in out):
                # experts picked per token; a level without experts has a sampling top_k (generation), not this
                experts = next(out[k] for k in out if _EXPERT_KEYS.match(k) and _int(out[k]))
                self.set_(key, min(TOP_K, experts))
            elif _TOPK_KEYS.match(key) and isinstance(v, list) and all(_int(x) for x in v) \
                    and any(_EXPERT_KEYS.match(k) and _int(out[k]) for k in out):
                # one top-k per layer (``moe_topk: [8, 8, ...]``): each no larger than the shrunk experts
                experts = next(out[k] for k in out if _EXPERT_KEYS.match(k) and _int(out[k]))
                out[key] = [min(x, TOP_K, experts) for x in v]
                if out[key] != v:
                    self.changes.append(f"{self.prefix}{key}: {v[:4]}{'...' if len(v) > 4 else ''} -> {out[key]} "
                                        f"(no more than the {experts} experts)")
            elif key in _TO_ONE and _int(v) and v > 1:
                self.set_(key, 1)


def _nested_layer_count(level: dict[str, Any]) -> int:
    """The largest layer count of a level's sub-configs (a period a wrapper sets for its language model's layers)."""
    return max((c for v in level.values() if isinstance(v, dict)
                for c in [*(x for k, x in v.items() if _LAYER_KEYS.match(k) and _int(x)), _nested_layer_count(v)]),
               default=0)


_FFN_WORD = re.compile(r"intermediate|ffn|inner|mlp|d_ff|feed_?forward|expert", re.I)
_LAYER_CALL = re.compile(r"\b(" + "|".join(sorted(SIZE_LAYERS)) + r")\(")


def _same_class(where: str, ffn: bool) -> bool:
    """Whether a cited site ("file:line \"code\"") sizes the class of key asked about: an FFN size only
    where the code names it one (intermediate, ffn, mlp ...); a width where a layer takes it as a size or
    a width-named size holds it."""
    code = where.split(" ", 1)[-1]
    if ffn:
        return bool(_FFN_WORD.search(code))
    return bool(_LAYER_CALL.search(code)) or not _FFN_WORD.search(code)


def _per_head_hidden(level: dict[str, Any], heads_key: str | None, hidden_key: str | None) -> int:
    """The shrunk width of a level: HEADS x its per-head size (``head_dim`` / ``head_size`` ... when given,
    else hidden / heads), never more than it was; HIDDEN where the level has neither heads nor a per-head
    size to go by."""
    if not hidden_key:
        return HIDDEN
    hidden = level[hidden_key]
    per_head = next((level[k] for k in level if _PER_HEAD_KEYS.match(k) and _int(level[k]) and level[k] > 0), None)
    if per_head is None and heads_key:
        heads = level[heads_key]
        per_head = hidden // heads if heads and hidden % heads == 0 else None
    if not per_head or (not heads_key and hidden % per_head):
        return HIDDEN
    return min(hidden, HEADS * int(per_head))


# Other widths of a level that the code pairs with its hidden size (attention_hidden_size, the inner width of
# a mixer, a projection's size): a size-named key holding the hidden size, or a small multiple of it.
_RATIO_MAX = 8
_NOT_A_WIDTH = re.compile(r"head|rotary|rope|lora|group|expert", re.I)


def _companion_widths(out: dict[str, Any], hidden_key: str, old: int, new: int, width: Any) -> None:
    """Shrink the level's other widths with its hidden size, keeping their ratio to it (a key equal to the
    hidden size or a multiple of it up to 8x): code that pairs them (``nn.Linear(hidden_size,
    attention_hidden_size)`` reshaped per head) needs the ratio, not the number."""
    for key in list(out):
        v = out[key]
        if key == hidden_key or not _int(v) or v < old or v % old or v // old > _RATIO_MAX or not _paired_width(key):
            continue
        width(key, new * (v // old), ffn=bool(_FFN_WORD.search(key)))


def _paired_width(key: str) -> bool:
    """A size-named key outside the classes a level shrinks by rule (hidden, FFN, heads, layers, experts,
    per-head sizes) and not a head / rotary / group size: a width that follows another one."""
    return _size_name(key) and not _NOT_A_WIDTH.search(key) and not any(r.match(key) for r in (
        _HIDDEN_KEYS, _FFN_KEYS, _HEAD_KEYS, _KV_KEYS, _LAYER_KEYS, _EXPERT_KEYS, _PER_HEAD_KEYS))


def _kept_by_code(hard: dict[int, list[tuple[str, str | None]]], prefix: str, key: str, value: int,
                  ffn: bool) -> str | None:
    """The change line keeping ``key`` at ``value`` when the model's code uses that number as a size of the
    key's class, else None. A default of a parameter named as the key (``width=128`` for "width") is the
    config's to override; a site of the other class of size (an FFN size for a width) is not this key's."""
    where = [w for w, param in hard.get(value, []) if param != key and _same_class(w, ffn)]
    return (f"{prefix}{key}: kept at {value}, the model's code uses {value} as a size at {where[0]} "
            f"(override: shrink: {{{prefix}{key}: N}} in npuport.yaml)") if where else None


def _levels(config: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every level of a config (the top, then its sub-configs at any depth) with its key prefix."""
    return [(prefix, config), *(lv for k, v in config.items() if isinstance(v, dict)
                                for lv in _levels(v, f"{prefix}{k}."))]


def _cross_level_widths(config: dict[str, Any], out: dict[str, Any], changes: list[str],
                        hard: dict[int, list[tuple[str, str | None]]]) -> None:
    """A width one level hands to another: a size-named key of one level (a vision tower's ``projection_dim``,
    a top-level ``mm_hidden_size``) equal to another level's hidden size, which the shrink reduced, follows it;
    the projection that joins the two towers is sized by it (``image_features @ image_projection`` is
    concatenated with the text embeddings). Left alone when the levels disagree on the new size, or when the
    code uses the number as a size itself."""
    new_levels = dict(_levels(out))
    shrunk: dict[int, dict[str, tuple[str, int]]] = {}  # old hidden -> {level: (its hidden key, new hidden)}
    for prefix, level in _levels(config):
        key = next((k for k in level if _HIDDEN_KEYS.match(k) and _int(level[k])), None)
        if key and _int(new_levels[prefix].get(key)) and new_levels[prefix][key] < level[key]:
            shrunk.setdefault(level[key], {})[prefix] = (key, new_levels[prefix][key])
    for prefix, level in _levels(config):
        target = new_levels[prefix]
        for key, v in level.items():
            if not _int(v) or v not in shrunk or target.get(key) != v or not _paired_width(key):
                continue
            others = {lv: kn for lv, kn in shrunk[v].items() if lv != prefix}
            if len({n for _, n in others.values()}) != 1:
                continue
            kept = _kept_by_code(hard, prefix, key, v, ffn=False)
            if kept:
                changes.append(kept)
                continue
            lv, (hidden_key, new) = next(iter(others.items()))
            target[key] = new
            changes.append(f"{prefix}{key}: {v} -> {new} (with {lv}{hidden_key})")
    _follow_the_level_fed(config, new_levels, shrunk, changes)


def _sized_by_heads(level: dict[str, Any]) -> bool:
    return any((_HEAD_KEYS.match(k) or _PER_HEAD_KEYS.match(k)) and _int(v) and v > 0 for k, v in level.items())


def _follow_the_level_fed(config: dict[str, Any], new_levels: dict[str, dict[str, Any]],
                          shrunk: dict[int, dict[str, tuple[str, int]]], changes: list[str]) -> None:
    """A level without heads of its own (a wrapper, a projector config) whose hidden size equals the hidden size
    of a level with heads (a language model) takes that level's shrunk width, and its paired widths keep their
    ratio: the projection it sizes feeds that level (``torch.cat([projected_audio, text_embeds])``), and a
    width of its own (HIDDEN) would no longer fit it. Left alone when it kept its width (the code's own size)."""
    original = dict(_levels(config))
    for prefix, level in original.items():
        key = next((k for k in level if _HIDDEN_KEYS.match(k) and _int(level[k])), None)
        if key is None or _sized_by_heads(level):
            continue
        old, target = level[key], new_levels[prefix]
        fed = {lv: kn for lv, kn in shrunk.get(old, {}).items() if lv != prefix and _sized_by_heads(original[lv])}
        if len({n for _, n in fed.values()}) != 1 or target.get(key) in (old, None):
            continue
        lv, (hidden_key, new) = next(iter(fed.items()))
        for k, v in level.items():
            if (k == key or _paired_width(k)) and _int(v) and v % old == 0 and 0 < v // old <= _RATIO_MAX \
                    and _int(target.get(k)) and target[k] < v:
                target[k] = new * (v // old)
                changes[:] = [c for c in changes if not c.startswith(f"{prefix}{k}:")]
                changes.append(f"{prefix}{k}: {v} -> {target[k]} (with {lv}{hidden_key}, the level it feeds)")


# ----------------------------------------------------------------------------------------------
# Size estimate (refuse a model too large for the box)
# ----------------------------------------------------------------------------------------------

def _find(config: dict[str, Any], pattern: re.Pattern[str]) -> int | None:
    for k, v in config.items():
        if pattern.match(k) and _int(v):
            return int(v)
    return None


def estimate_params(config: dict[str, Any]) -> int:
    """A rough parameter count of a transformer config, summed over its nested sub-configs."""
    total = 0
    hidden = _find(config, _HIDDEN_KEYS)
    layers = _find(config, _LAYER_KEYS)
    if hidden and layers:
        ffn = _find(config, re.compile(r"^(intermediate_size|ffn_dim|ffn_hidden_size|n_inner|d_ff)$")) or 4 * hidden
        experts = _find(config, _EXPERT_KEYS) or 0
        moe_ffn = _find(config, re.compile(r"^moe_intermediate_size$")) or ffn
        dense = min(layers, _find(config, re.compile(r"^first_k_dense_replace$")) or 0) if experts else layers
        shared = _find(config, re.compile(r"^n_shared_experts$")) or 0
        total += (layers * 4 * hidden * hidden + dense * 3 * hidden * ffn
                  + (layers - dense) * (experts + shared) * 3 * hidden * moe_ffn)
        vocab = _find(config, re.compile(r"^vocab_size$"))
        if vocab:
            total += 2 * vocab * hidden
    nested = sum(estimate_params(v) for v in config.values() if isinstance(v, dict))
    # Composite configs often repeat the language model's sizes at the top level: count them once.
    return max(total, nested) if total and nested and total <= nested * 1.5 else total + nested
