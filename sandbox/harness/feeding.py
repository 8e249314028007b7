"""What a run feeds the model and calls: the inputs (the manifest's hook, the model's own preprocessing
path, or inputs synthesised from the run method's signature: sandbox/inputs/), moved to the run's device,
and the method the inputs were built for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox.harness.model_build import _load_attr


def to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):  # e.g. images as a list of (crops, global view) tuples
        moved = [to_device(v, device) for v in value]
        return type(value)(moved) if isinstance(value, list) or type(value) is tuple else type(value)(*moved)
    return value


def method_at(model: Any, path: str) -> Any:
    """``generate``, or a submodule's (``language_model.generate``) that the preprocessing path called."""
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def model_inputs_for(model: Any, manifest: dict[str, Any], model_dir: Path, config: dict[str, Any], seed: int,
                     run_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(inputs, generate kwargs the inputs' source passed, {source, notes}): the manifest's inputs
    function, else the model's own preprocessing path, else inputs synthesised from the signature."""
    from sandbox.inputs.model_inputs import PreprocessingFailed, capture_preprocessed

    run_cfg = manifest.get("run") or {}
    if manifest.get("inputs"):
        return _load_attr(manifest["inputs"], model_dir)(config, seed), {}, \
            {"source": "hook", "notes": [f"inputs from {manifest['inputs']}(config, seed)"]}
    if isinstance(run_cfg.get("rebuild_inputs"), dict):
        return _rebuilt(model, run_cfg["rebuild_inputs"], model_dir, config, seed)
    notes: list[str] = []
    if run_cfg.get("preprocess"):
        try:
            got = capture_preprocessed(model, run_cfg["preprocess"], model_dir, config, seed,
                                       max_new_tokens=int(run_kwargs.get("max_new_tokens") or 8))
            # a model that generates through a submodule (its language model): the run calls that generate
            return got.inputs, got.kwargs, {"source": "preprocess", "notes": got.notes,
                                            **({"method": got.method} if got.method else {})}
        except PreprocessingFailed as exc:
            notes = [f"the model's preprocessing path could not be driven ({exc}); inputs synthesised instead"]
    inputs, source = _synthesised(model, run_cfg.get("method", "generate"), config, seed, notes)
    return inputs, {}, source


# The message a failed rebuild raises with (hazard H26 reads it: agents/rules/h26_generate_inputs.py)
REBUILD_FAILED = "rebuild-inputs: "


def _rebuilt(model: Any, fix: dict[str, Any], model_dir: Path, config: dict[str, Any],
             seed: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The debugger's inputs fix (hazard H26): the inputs rebuilt with the model's own input-building code;
    when that code cannot give what the generate path needs, the run fails saying so (never made-up inputs)."""
    from sandbox.inputs.inputs_base import PreprocessingFailed
    from sandbox.inputs.own_inputs import own_built_inputs

    needs = [str(n) for n in fix.get("needs") or []]
    token = fix.get("token") if isinstance(fix.get("token"), int) else None
    try:
        inputs, kwargs, notes = own_built_inputs(model, model_dir, config, seed, needs, token)
    except PreprocessingFailed as exc:
        raise PreprocessingFailed(f"{REBUILD_FAILED}{exc}") from exc
    why = str(fix.get("why") or "the generate path needs inputs the model's own code builds")
    return inputs, kwargs, {"source": "model-built",
                            "notes": [f"inputs fix (not a code patch): {why}; {notes[0]}", *notes[1:]]}


def _synthesised(model: Any, method: str, config: dict[str, Any], seed: int,
                 notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    from sandbox.inputs.model_inputs import (
        pixel_grid_names,
        synthesise_inputs,
        synthesised_tower_notes,
        text_wrapper_language_model,
        unfed_parameters,
    )

    lm = text_wrapper_language_model(model, method)
    if lm:
        # the model's own generate takes text (generate(text, image)) and its preprocessing path could not be
        # driven: its language model generates on token ids, the part validated without the model's own path
        inputs = synthesise_inputs(model.get_submodule(lm), "generate", config, seed)
        notes.append(f"{type(model).__name__}.generate takes text, not token ids: the run calls its language model "
                     f"{lm}.generate ({type(model.get_submodule(lm)).__name__}) on synthesised ids ("
                     + ", ".join(sorted(inputs)) + "); the model's other inputs (an image) are not exercised")
        return inputs, {"source": "synthesised", "notes": notes, "method": f"{lm}.generate"}
    inputs = synthesise_inputs(model, method, config, seed)
    notes.append("inputs synthesised from the run method's signature: " + ", ".join(sorted(inputs)))
    notes += synthesised_tower_notes(model, method, config)
    if left := unfed_parameters(model, method, set(inputs)):
        notes.append(f"{method} also takes {', '.join(left)}, left out: npuport builds token ids and the data of "
                     "a tower it can tell from a parameter's name (pixels, audio); an npuport_inputs.py gives the "
                     "rest, and the Coverage section says what did not run")
    grids = pixel_grid_names(model, method)
    if grids:
        notes.append(f"the pixels are left out: {method} takes them with {', '.join(grids)} (packed patches and each "
                     "image's grid, a structure npuport does not guess); the text alone is run, so the vision tower "
                     "is not exercised (the model's own processor, or an npuport_inputs.py, would give both)")
    return inputs, {"source": "synthesised", "notes": notes}
