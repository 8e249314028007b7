"""Stage schedules: the per-stage lists of a hierarchical tower, shrunk together.

A hierarchical vision tower (DaViT, Swin, ConvNeXt, PVT, SegFormer, ResNet ...) writes its size as lists with one
entry per stage: the blocks of each stage (``depths: [1, 1, 9, 1]``), each stage's width (``dim_embed``,
``hidden_sizes``, ``embed_dims``) and its heads or groups (``num_heads``, ``num_groups``). The scalar shrink
(sandbox/harness/shrink.py) reads none of them, so such a tower ran at full size (a 2048-wide last stage) and
its ports timed out. Here every stage is kept (the code indexes the lists by stage), each stage keeps up to
STAGE_DEPTH blocks (blocks that alternate kinds, e.g. shifted and unshifted windows, keep both), and the widths
keep their ratios from a first stage of STAGE_BASE_WIDTH with each stage's heads and groups dividing its width.
A level whose widths the back-off keeps (shrink_fit) shrinks only its depths.
"""

from __future__ import annotations

import re
from typing import Any

STAGE_DEPTH = 2
STAGE_BASE_WIDTH = 32
MIN_PER_HEAD = 8
MAX_STAGES = 8
MAX_STAGE_DEPTH = 128  # a list of larger numbers is not a count of blocks

_DEPTH_KEY = re.compile(r"depth|(^|_)(layers|blocks)$|layers_per_stage|block_counts?$", re.I)
_WIDTH_KEY = re.compile(r"dim|embed|width|hidden|channel", re.I)
_DIVISOR_KEY = re.compile(r"head|group", re.I)
_NOT_A_SIZE = re.compile(r"ratio|kernel|patch|stride|pad|window|drop|rate|scale|prenorm", re.I)


def _int_list(value: Any) -> bool:
    return (isinstance(value, list) and 2 <= len(value) <= MAX_STAGES
            and all(isinstance(x, int) and not isinstance(x, bool) for x in value))


def _short(values: list[int]) -> str:
    return "[" + ", ".join(map(str, values)) + "]"


def _set(level: dict[str, Any], key: str, new: list[int], prefix: str, changes: list[str], why: str = "") -> None:
    old = level[key]
    if new != old:
        level[key] = new
        changes.append(f"{prefix}{key}: {_short(old)} -> {_short(new)}{why}")


def stage_depth_keys(level: dict[str, Any]) -> list[str]:
    """The level's per-stage block counts (one length), or [] for a level that has no stages."""
    keys = [k for k, v in level.items() if _DEPTH_KEY.search(k) and not _NOT_A_SIZE.search(k) and _int_list(v)
            and all(0 <= x <= MAX_STAGE_DEPTH for x in v)]
    return [k for k in keys if len(level[k]) == len(level[keys[0]])] if keys else []


def shrunk_widths(widths: list[int]) -> list[int]:
    """Each stage's width with the ratios kept, the narrowest at STAGE_BASE_WIDTH, each a multiple of 8."""
    scale = STAGE_BASE_WIDTH / min(widths)
    return [max(MIN_PER_HEAD, 8 * round(w * scale / 8)) for w in widths]


def divisor_at_most(width: int, most: int) -> int:
    """The largest count <= ``most`` that divides ``width`` with at least MIN_PER_HEAD per part (1 at least)."""
    return next((d for d in range(min(most, width // MIN_PER_HEAD), 0, -1) if width % d == 0), 1)


def shrink_stages(level: dict[str, Any], original: dict[str, Any], prefix: str, changes: list[str],
                  keep_widths: bool) -> None:
    """Shrink ``level``'s stage schedule in place (nothing when it has none), each change appended to ``changes``.
    ``original``: the level as written (a scalar width the size shrink already reduced is read against it)."""
    depth_keys = stage_depth_keys(level)
    if not depth_keys:
        return
    stages = len(level[depth_keys[0]])
    for key in depth_keys:
        _set(level, key, [min(x, STAGE_DEPTH) for x in level[key]], prefix, changes, " (every stage kept)")
    if keep_widths:
        return
    width_keys = [k for k, v in level.items() if k not in depth_keys and _WIDTH_KEY.search(k)
                  and not _DIVISOR_KEY.search(k) and not _NOT_A_SIZE.search(k) and _int_list(v)
                  and len(v) == stages and min(v) >= 2 * STAGE_BASE_WIDTH]
    divisor_keys = [k for k, v in level.items() if _DIVISOR_KEY.search(k) and _int_list(v) and len(v) == stages]
    if width_keys:
        old_widths = list(level[width_keys[0]])
        for key in width_keys:
            _set(level, key, shrunk_widths(level[key]), prefix, changes)
        widths = level[width_keys[0]]
        _follow_last_width(level, old_widths[-1], widths[-1], prefix, changes)
    else:
        widths = _widths_from_a_scalar(level, original, divisor_keys)
        if widths is None:
            return
    for key in divisor_keys:
        _set(level, key, [divisor_at_most(w, h) for w, h in zip(widths, level[key], strict=True)], prefix, changes,
             " (dividing each stage's width)")


def _widths_from_a_scalar(level: dict[str, Any], original: dict[str, Any], divisor_keys: list[str]) -> list[int] | None:
    """Each stage's width where the level writes only the first (Swin's ``embed_dim`` with ``num_heads`` per stage):
    the shrunk first width times each stage's share of heads (a constant per-head size), or None."""
    if not divisor_keys:
        return None
    key = next((k for k, v in level.items() if isinstance(v, int) and _WIDTH_KEY.search(k)
                and isinstance(original.get(k), int) and v < original[k]), None)
    heads = level[divisor_keys[0]]
    if key is None or not heads[0]:
        return None
    return [level[key] * h // heads[0] for h in heads]


def _follow_last_width(level: dict[str, Any], old: int, new: int, prefix: str, changes: list[str]) -> None:
    """A scalar the level sets to the last stage's width (what the tower hands on) follows it."""
    for key, value in list(level.items()):
        if isinstance(value, int) and not isinstance(value, bool) and value == old \
                and _WIDTH_KEY.search(key) and not _NOT_A_SIZE.search(key):
            level[key] = new
            changes.append(f"{prefix}{key}: {value} -> {new} (the last stage's width)")
