"""Which layers a shrunk config keeps: at least one of every kind the full model has.

A config says which kind each layer is in a few shapes, read here by shape, never by model:

- a per-layer list, as long as the layer count (``layer_types: ["linear_attention", "full_attention", ...]``,
  ``layers_block_type``, ``block_types``, ``mixer_types``, ``no_rope_layers: [1, 1, 1, 0, ...]``, a per-layer
  ``num_experts`` with 0 for the dense layers): each distinct value is a kind (numbers only when they take at
  most ``MAX_NUMERIC_KINDS`` values and do not grow layer by layer: such a list is a schedule of sizes, cut to
  the kept layers without choosing them);
- a pattern string as long as the layer count (``hybrid_override_pattern: "M-M*-"``): each character a kind;
- an index list below the layer count (``attn_layer_indices``, ``mlp_only_layers``, ``cross_attention_layers``):
  in the list or not;
- a boundary (``first_k_dense_replace``, ``max_window_layers``): the layers below it and those from it on;
- a period, with an optional offset (``attn_layer_period`` + ``attn_layer_offset``, ``decoder_sparse_step``,
  ``moe_layer_freq``, ``cross_attn_every_n_layers``, ``sliding_window_pattern``): every P-th layer is of
  another kind. Where the counting starts differs between releases (``i % P == O``, ``(i + 1) % P == 0``), so
  a period is not read into kinds: it becomes 2 (its offset taken mod 2), and every two consecutive layers of
  the shrunk model hold one of each whatever the convention.

The kept layers are the first of each kind (all distinct combinations), and at least ``LAYERS``; the layer
count becomes their number, and each list, string, index list and boundary is remapped onto them, so layer
j of the shrunk model has the kind of kept layer j of the full one. ``layer_kinds`` reads the same rules
back from a (shrunk) config for the run's coverage record: which layer indices hold which kind.

Used by sandbox/harness/shrink.py inside the sandbox: standard library only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

LAYERS = 2
MAX_NUMERIC_KINDS = 4  # a per-layer list of numbers with more distinct values is a size schedule, not kinds

# Names that say a key describes the layers (a per-layer list or an index list), and names that say it does not.
_LAYER_WORDS = re.compile(r"layer|block|type|mixer|pattern|window|moe|expert|attn|attention|sparse|dense|head|"
                          r"ffn|intermediate|mlp|rope|topk|top_k|shared|skip|swa|global|local|linear|conv|mamba|"
                          r"ssm|cross|multiplier|kind|mode", re.I)
_NOT_LAYER_WORDS = re.compile(r"token|(^|_)ids?$|pinpoint|grid|architectures|section|mean|std|image|patch|"
                              r"vocab|model_type|dtype", re.I)
_INDEX_WORDS = re.compile(r"layer|block|idx|indices|index", re.I)
_PERIOD_KEY = re.compile(r"(period|every_n(_layers)?|_freq|_step|interval|_pattern)$", re.I)
_PERIOD_WORDS = re.compile(r"layer|moe|attn|attention|sparse|expert|window|cross|block|global|dense|mamba|ssm",
                           re.I)
_BOUNDARY_KEY = re.compile(r"^(first_k_\w+|max_window_layers|(num|n)_dense_layers)$")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class LayerRules:
    """The keys of one config level that say which kind each of its ``count`` layers is."""

    count: int
    per_layer: list[str] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    """per-layer lists of sizes (not kinds): cut to the kept layers like the others"""
    patterns: list[str] = field(default_factory=list)
    indices: list[str] = field(default_factory=list)
    boundaries: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return [*self.per_layer, *self.patterns, *self.indices, *self.boundaries]


def _describes_layers(key: str) -> bool:
    return bool(_LAYER_WORDS.search(key)) and not _NOT_LAYER_WORDS.search(key)


def _categorical(values: list[Any]) -> bool:
    """A per-layer list whose values are kinds: words, flags, or few distinct numbers that do not grow or shrink
    layer by layer (``[4, 4, 6, 6, 8, 8]`` heads per layer is a schedule of sizes)."""
    distinct = {json.dumps(v, sort_keys=True) for v in values}
    if all(v is None or isinstance(v, str | bool) for v in values):
        return True
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) == len(values) and len(distinct) > 2 and (numbers == sorted(numbers)
                                                               or numbers == sorted(numbers, reverse=True)):
        return False
    return len(distinct) <= MAX_NUMERIC_KINDS


def rules_for(level: dict[str, Any], count: int) -> LayerRules:
    """The keys of ``level`` that describe its ``count`` layers."""
    rules = LayerRules(count)
    for key, v in level.items():
        if isinstance(v, list) and len(v) == count and _describes_layers(key):
            (rules.per_layer if _categorical(v) else rules.schedules).append(key)
        elif isinstance(v, list) and v and len(v) < count and _INDEX_WORDS.search(key) \
                and not _NOT_LAYER_WORDS.search(key) and all(_int(i) and 0 <= i < count for i in v) \
                and len(set(v)) == len(v):
            rules.indices.append(key)
        elif isinstance(v, str) and len(v) == count and (
                "pattern" in key.lower() or (_INDEX_WORDS.search(key) and len(set(v)) <= 6)):
            rules.patterns.append(key)
        elif _BOUNDARY_KEY.match(key) and _int(v) and 0 < v < count:
            rules.boundaries.append(key)
    return rules


def _kind_of(level: dict[str, Any], rules: LayerRules, i: int) -> tuple[Any, ...]:
    return (*(json.dumps(level[k][i], sort_keys=True) for k in rules.per_layer),
            *(level[k][i] for k in rules.patterns),
            *(i in level[k] for k in rules.indices),
            *(i < level[k] for k in rules.boundaries))


@dataclass(frozen=True)
class Kept:
    """The layers a level keeps, the rules that chose them, and how many kinds they name."""

    layers: list[int]
    rules: LayerRules
    kinds: int


def kept_layers(level: dict[str, Any], count: int) -> Kept:
    """The full model's layer indices the shrunk one keeps: the first of every kind, at least LAYERS."""
    rules = rules_for(level, count)
    first: dict[tuple[Any, ...], int] = {}
    for i in range(count):
        first.setdefault(_kind_of(level, rules, i), i)
    kept = sorted(first.values())
    for i in range(count):  # fill up to LAYERS with the first layers
        if len(kept) >= min(LAYERS, count):
            break
        if i not in kept:
            kept = sorted({*kept, i})
    return Kept(kept, rules, len(first))


def remap(out: dict[str, Any], original: dict[str, Any], rules: LayerRules, kept: list[int],
          prefix: str, changes: list[str]) -> None:
    """Each of the level's layer-kind keys rewritten onto the kept layers (``out`` in place)."""
    for key in [*rules.per_layer, *rules.schedules]:
        out[key] = [original[key][i] for i in kept]
    for key in rules.patterns:
        out[key] = "".join(original[key][i] for i in kept)
    for key in rules.indices:
        members = set(original[key])
        out[key] = [j for j, i in enumerate(kept) if i in members]
    for key in rules.boundaries:
        out[key] = sum(1 for i in kept if i < original[key])
    for key in [*rules.all(), *rules.schedules]:
        if out[key] != original[key]:
            changes.append(f"{prefix}{key}: {_short(original[key])} -> {_short(out[key])} (onto the kept layers)")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, int) else str(value)
    if isinstance(value, list) and len(value) > 4:
        shown = ", ".join(json.dumps(v) for v in value[:4])
        return f"[{shown}, ... {len(value)} items]"
    return text if len(text) <= 120 else text[:117] + "..."


def kept_note(prefix: str, layer_keys: list[str], count: int, kept: list[int], level: dict[str, Any],
              rules: LayerRules) -> str:
    """The change line of a layer count that keeps one layer of each kind."""
    kinds = sorted({_label(level, rules, i) for i in kept})
    return (f"{prefix}{layer_keys[0]}: {count} -> {len(kept)} (one layer of every kind the config names: layers "
            f"{', '.join(map(str, kept))} of {count} kept; {'; '.join(kinds)})")


def _label(level: dict[str, Any], rules: LayerRules, i: int) -> str:
    varying = [k for k in rules.per_layer if len({json.dumps(v, sort_keys=True) for v in level[k]}) > 1]
    parts = [f"{k}={level[k][i]}" for k in varying]
    parts += [f"{k}={level[k][i]!r}" for k in rules.patterns if len(set(level[k])) > 1]
    parts += [f"{'in' if i in level[k] else 'not in'} {k}" for k in rules.indices]
    parts += [f"{'below' if i < level[k] else 'from'} {k}" for k in rules.boundaries]
    return ", ".join(parts)


def periods(level: dict[str, Any], count: int) -> list[tuple[str, str | None]]:
    """(period key, its offset key or None) of the level's periodic layer rules: 2 <= period <= count."""
    found = []
    for key, v in level.items():
        if _PERIOD_KEY.search(key) and _PERIOD_WORDS.search(key) and _int(v) and 2 <= v <= count:
            stem = _PERIOD_KEY.sub("", key)
            offset = next((k for k in level if k != key and k.startswith(stem) and k.endswith("offset")
                           and _int(level[k])), None)
            found.append((key, offset))
    return found


def shrink_periods(out: dict[str, Any], count: int, prefix: str, changes: list[str]) -> None:
    """Each period -> 2 and its offset mod 2: every two consecutive layers hold one of each kind."""
    for key, offset in periods(out, count):
        old = out[key]
        if old == 2 and (offset is None or out[offset] in (0, 1)):
            continue
        out[key] = 2
        changes.append(f"{prefix}{key}: {old} -> 2 (every other layer: the shrunk model keeps both kinds)")
        if offset is not None and out[offset] % 2 != out[offset]:
            was = out[offset]
            out[offset] = was % 2
            changes.append(f"{prefix}{offset}: {was} -> {out[offset]} (with {prefix}{key})")


@dataclass(frozen=True)
class LevelKinds:
    """The layer kinds a (shrunk) config level names: for the run's coverage record."""

    prefix: str
    count: int
    by_key: dict[str, dict[str, list[int]]]
    """config key -> {kind label ("layer_types=linear_attention", "in mlp_only_layers", "below
    first_k_dense_replace") -> the layer indices of that kind}"""

    def kinds(self, keys: set[tuple[str, str]] | None = None) -> dict[str, list[int]]:
        """label -> indices, of every key or of the (prefix, key) pairs in ``keys``."""
        return {label: idx for key, labels in self.by_key.items() if keys is None or (self.prefix, key) in keys
                for label, idx in labels.items()}


def _kinds_of(config: dict[str, Any], rules: LayerRules, count: int) -> dict[str, dict[str, list[int]]]:
    by_key: dict[str, dict[str, list[int]]] = {}
    for key in rules.per_layer:
        if len({json.dumps(v, sort_keys=True) for v in config[key]}) > 1:  # one value for all: a setting
            for i, v in enumerate(config[key]):
                by_key.setdefault(key, {}).setdefault(f"{key}={v}", []).append(i)
    for key in rules.patterns:
        if len(set(config[key])) > 1:
            for i, ch in enumerate(config[key]):
                by_key.setdefault(key, {}).setdefault(f"{key}={ch!r}", []).append(i)
    for key in rules.indices:
        by_key[key] = {f"in {key}": sorted(config[key]),
                       f"not in {key}": [i for i in range(count) if i not in config[key]]}
    for key in rules.boundaries:
        by_key[key] = {f"below {key}": list(range(config[key])), f"from {key}": list(range(config[key], count))}
    return {key: {label: idx for label, idx in labels.items() if idx} for key, labels in by_key.items()}


def layer_kinds(config: dict[str, Any], layer_key: re.Pattern[str], prefix: str = "") -> list[LevelKinds]:
    """Every level's layer kinds, by the rules above, with the indices that hold each: one entry per level
    and layer count whose config names kinds."""
    found: list[LevelKinds] = []
    counts = sorted({v for k, v in config.items() if layer_key.match(k) and _int(v) and v > 0})
    for count in counts:
        by_key = _kinds_of(config, rules_for(config, count), count)
        if by_key:
            found.append(LevelKinds(prefix, count, by_key))
    for key, v in config.items():
        if isinstance(v, dict):
            found += layer_kinds(v, layer_key, f"{prefix}{key}.")
    return found
