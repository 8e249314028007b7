"""Which parts of the model a run exercised: the module kinds the evidence covers.

Before the run builds its inputs (a preprocessing path may run the vision tower itself) every module of
interest gets a forward pre-hook that records the first call and removes itself, so a long generate pays
for it once. What is watched, by what the model and its config say:

- **layer kinds**: a layer stack is a ``ModuleList`` / ``Sequential`` whose items are layers (each holds a
  module that has parameterised children of its own: an attention, a mixer; an expert list is not a stack).
  A layer's kind is its class and, where the stack's layers differ, the classes of the children that differ
  (``HybridLayer (mixer: Mamba2Mixer)`` beside ``HybridLayer (mixer: Attention)``; a dense MLP beside an MoE);
- **layer types the config names** (sandbox/harness/shrink_layers.py ``layer_kinds``: ``layer_types=
  full_attention``, ``in mlp_only_layers``, ``below first_k_dense_replace``): placed on the layer stack as
  long as that config level's layer count; a kind of the full config that the run's config no longer has
  (an override cut the layers) counts as not run;
- **towers**: a module built from one of the config's sub-configs (its ``config`` is ``config.audio_config``,
  ``config.vision_config``...): the role is that key;
- **parts**: the parameterised modules at most two names deep outside the layer stacks (a vision encoder, an
  audio projector, the language model); a container (it has parameterised children) is a kind, a single
  layer (``lm_head``) is listed only: its weights are often read directly (tied embeddings).

The record (``CoverageRecorder.report``) is data for the report (agents/validation/coverage.py reads it):
every kind with whether it ran, and the watched modules that ran and did not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sandbox.harness.shrink import _LAYER_KEYS
from sandbox.harness.shrink_layers import layer_kinds

PART_DEPTH = 2
MAX_LISTED = 64


def _has_params(module: Any) -> bool:
    return next(module.parameters(), None) is not None


def _is_container(module: Any) -> bool:
    return any(_has_params(c) for c in module.children())


def _is_layer(module: Any) -> bool:
    """A layer of a stack: one of its children has parameterised children itself (an attention, a mixer)."""
    return any(_is_container(c) for c in module.children())


def _is_list(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.ModuleList | torch.nn.Sequential)


def _holds_only(module: Any) -> bool:
    """A ModuleList / ModuleDict: never called itself, its items are."""
    import torch

    return isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict)


def layer_stacks(model: Any) -> dict[str, tuple[int, dict[int, Any]]]:
    """name -> (its length, {index: layer}) of every layer stack, outermost only (a stack inside a layer is
    the layer's own). A ``Sequential`` that opens with an embedding and ends with a head keeps only its layers."""
    stacks: dict[str, tuple[int, dict[int, Any]]] = {}
    for name, module in model.named_modules():
        if any(name.startswith(f"{s}.") for s in stacks) or not name or not _is_list(module):
            continue
        # a list may hold None where a layer has no such part (a cross-attention every other layer)
        layers = {i: m for i, m in enumerate(module) if m is not None and _is_layer(m)}
        if layers:
            stacks[name] = (len(module), layers)
    return stacks


def _layer_labels(layers: dict[int, Any]) -> dict[int, str]:
    """Each layer's kind: its class, and the classes of the children in which the stack's layers differ."""
    children = {i: {n: type(c).__name__ for n, c in m.named_children()} for i, m in layers.items()}
    names = {n for ch in children.values() for n in ch}
    varying = sorted(n for n in names if len({ch.get(n) for ch in children.values()}) > 1)
    labels = {}
    for i, m in layers.items():
        parts = [f"{n}: {children[i][n]}" for n in varying if n in children[i]]
        labels[i] = type(m).__name__ + (f" ({', '.join(parts)})" if parts else "")
    return labels


def towers(model: Any) -> dict[str, str]:
    """module name -> the sub-config key it is built from (``audio_config``), the shallowest per key."""
    top = getattr(model, "config", None)
    if top is None:
        return {}
    keys = {id(v): k for k, v in vars(top).items() if not k.startswith("_") and hasattr(v, "to_dict")} \
        if hasattr(top, "__dict__") else {}
    found: dict[str, str] = {}
    for name, module in model.named_modules():
        key = keys.get(id(getattr(module, "config", None)))
        if name and key and key not in found.values() and _has_params(module):
            found[name] = key
    return found


class CoverageRecorder:
    """Watch a built model's layers, towers and parts; ``report()`` after the run."""

    def __init__(self, model: Any, run_config: dict[str, Any], full_config: dict[str, Any] | None) -> None:
        self.ran: set[str] = set()
        self.handles: list[Any] = []
        self.model = model
        self.stacks = layer_stacks(model)
        self.towers = towers(model)
        in_stack = tuple(f"{s}." for s in self.stacks)
        self.parts = {name: m for name, m in model.named_modules()
                      if name and name.count(".") < PART_DEPTH and not name.startswith(in_stack)
                      and name not in self.stacks and not _holds_only(m) and _has_params(m)}
        self.run_kinds = layer_kinds(run_config, _LAYER_KEYS)
        self.has_full = full_config is not None
        self.full_kinds = layer_kinds(full_config, _LAYER_KEYS) if full_config else []
        # every module that holds parameters of its own: a module counts as run when it or one inside it ran
        # (code that calls ``self.audio_tower.forward(...)`` bypasses the tower's own hooks, not its layers')
        for name, module in model.named_modules():
            if name and (next(module.parameters(recurse=False), None) is not None or name in self.parts
                         or name in self.towers):
                self._watch(name, module)
        for stack, (_, layers) in self.stacks.items():
            for i, m in layers.items():
                self._watch(f"{stack}.{i}", m)

    def did_run(self, name: str) -> bool:
        return name in self.ran or any(r.startswith(f"{name}.") for r in self.ran)

    def _watch(self, name: str, module: Any) -> None:
        holder: list[Any] = []

        def seen(_m: Any, _args: Any) -> None:
            self.ran.add(name)
            holder[0].remove()

        holder.append(module.register_forward_pre_hook(seen))
        self.handles.append(holder[0])

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def report(self) -> dict[str, Any]:
        """{kinds: [{kind, role, ran, modules}], ran: [...], not_run: [...]}."""
        self.close()
        kinds = [*self._layer_kinds(), *self._config_kinds(),
                 *({"kind": f"{name} ({type(self.model.get_submodule(name)).__name__}, from {key})", "role": "tower",
                    "ran": self.did_run(name), "modules": [name]} for name, key in self.towers.items()),
                 *({"kind": f"{name} ({type(m).__name__})", "role": "part", "ran": self.did_run(name),
                    "modules": [name]} for name, m in self.parts.items()
                   if _is_container(m) and name not in self.towers)]
        watched = [*self.towers, *(n for n in self.parts if n not in self.towers)]
        return {"kinds": kinds, "ran": [n for n in watched if self.did_run(n)][:MAX_LISTED],
                "not_run": [n for n in watched if not self.did_run(n)][:MAX_LISTED]}

    def _layer_kinds(self) -> list[dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for stack, (_, layers) in self.stacks.items():
            for i, label in _layer_labels(layers).items():
                entry = out.setdefault(f"{stack}: {label}", {"kind": f"{stack}: {label}", "role": "layer",
                                                              "ran": False, "modules": []})
                entry["modules"].append(f"{stack}.{i}")
                entry["ran"] = entry["ran"] or self.did_run(f"{stack}.{i}")
        return list(out.values())

    def _config_kinds(self) -> list[dict[str, Any]]:
        """The layer types the config names, placed on the stack of that many layers. A key names layer types
        when the full config says so: a 2-item list of the run's config is not per-layer because the layer count
        became 2 (``dense_list: [4096, 0]`` beside 32 layers)."""
        out: list[dict[str, Any]] = []
        rules = {(lv.prefix, key) for lv in self.full_kinds for key in lv.by_key} if self.has_full else None
        kept = {(lv.prefix, k) for lv in self.run_kinds for k in lv.kinds(rules)}
        for lv in self.full_kinds:
            for kind in lv.kinds():
                if (lv.prefix, kind) not in kept:
                    out.append({"kind": f"{lv.prefix}{kind}", "role": "layer type", "ran": False, "modules": [],
                                "why": "the run's config has no layer of this kind"})
        for lv in self.run_kinds:
            stacks = [s for s, (length, _) in self.stacks.items() if length == lv.count]
            for kind, indices in lv.kinds(rules).items():
                entry: dict[str, Any] = {"kind": f"{lv.prefix}{kind}", "role": "layer type",
                                         "modules": [f"{s}.{i}" for s in stacks for i in indices]}
                if not stacks:
                    entry.update(ran=None, why=f"no layer stack of {lv.count} layers to place it on")
                else:
                    entry["ran"] = all(any(self.did_run(f"{s}.{i}") for i in indices) for s in stacks)
                out.append(entry)
        return out


def full_config_of(model_dir: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """config.json as written (the full model's layer types), None when it does not read."""
    try:
        config = json.loads((model_dir / manifest.get("config", "config.json")).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None
