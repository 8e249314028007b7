"""The servable folder (runs inside the sandbox): the exact model the reference ran (its shrunk config,
its seeded weights) saved the way vLLM loads a model, and which vLLM implementation can serve it.

Three paths, decided from the model's classes and weight layout, never from its name:

- ``vllm-native``: config.json names an architecture vLLM implements; the state dict is saved as it is.
  vLLM's own class runs, not the model's (patched) code.
- ``vllm-native-layout``: the architecture is unknown to vLLM, but the weights have the layout of one of
  vLLM's decoder classes (sandbox/serving/layouts.py: Llama, Qwen2, Llama with attention biases, StableLM,
  told apart by their norms and biases). The weights are renamed to that layout (a fused gate/up
  projection is split) and the config written in that class's terms. The token check through the
  server decides whether that class computes what the model computes.
- ``transformers-backend``: a transformers ``PreTrainedModel`` vLLM has no class for: saved with its
  (patched) code and served with ``--model-impl transformers``, which runs that code. vLLM's backend
  takes only classes written for transformers' attention interface; sandbox/serving/client.py asks the
  class in the vLLM env before starting the server, and a class it refuses has no vLLM path.

Otherwise there is no vLLM path, and :func:`what_vllm_needs` says what a vLLM model class would need.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from sandbox.serving.layouts import convert, decoder_layout, layout_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "vocab.txt", "added_tokens.json", "generation_config.json")
_CONFIG_NOTE = "config.json rewritten in the terms of vLLM's class (sandbox/serving/layouts.py SYNONYMS)"


def what_vllm_needs(model: Any) -> dict[str, Any]:
    """For a model with no vLLM path: its layer classes (with counts) and its weight names, with layer
    indices folded, which a vLLM model class would have to implement and load."""
    classes: dict[str, int] = {}
    for module in model.modules():
        if not list(module.children()):
            classes[type(module).__name__] = classes.get(type(module).__name__, 0) + 1
    names = sorted({re.sub(r"\.\d+\.", ".N.", n) for n, _ in model.named_parameters()})
    return {"leaf_layers": classes, "weight_names": names[:60], "weight_name_count": len(names)}


SHARD_BYTES = 512 * 2**20  # below the sandbox's per-file limit (Limits.file_size_mb, 1 GiB)


def _save(state: dict[str, Any], out_dir: Path, shard_bytes: int = SHARD_BYTES) -> None:
    """The weights as safetensors: one model.safetensors, or, past ``shard_bytes``, shards with the
    model.safetensors.index.json that transformers and vLLM read (a shrunk vision-language model keeps
    towers its code sizes, over the sandbox's 1 GiB per file: DeepSeek-OCR-2's export failed with EFBIG)."""
    import json

    from safetensors.torch import save_file

    # Tied weights share storage; safetensors wants each tensor once, contiguous.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def without_quantization(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config without any quantization_config (at any level: a text sub-config's too), and the dropped
    ones as "key: method"."""
    dropped: list[str] = []

    def strip(c: dict[str, Any], where: str) -> dict[str, Any]:
        out = {}
        for k, v in c.items():
            if k == "quantization_config" and isinstance(v, dict):
                dropped.append(f"{where}{k}: {v.get('quant_method') or '?'}")
            else:
                out[k] = strip(v, f"{where}{k}.") if isinstance(v, dict) else v
        return out

    return strip(config, ""), dropped


def export(model: Any, config: dict[str, Any], model_dir: Path, code_dir: Path, out_dir: Path,
           known: set[str], config_types: set[str] | None = None, backend_only: bool = False) -> dict[str, Any]:
    """Write the servable folder for ``model`` (built and seeded as the reference was) into ``out_dir``;
    returns {implementation, architecture, detail, tokenizer, ...}. ``code_dir`` holds the ported code;
    ``known`` is the architectures vLLM implements, ``config_types`` the config model types its env reads
    with its own classes (both asked of the vLLM environment). ``backend_only``: the vLLM classes failed
    the model (crashed, or computed other tokens), so only the Transformers backend over the patched code
    is considered."""
    config_types = config_types or set()
    if backend_only:
        known = set()
    out_dir.mkdir(parents=True, exist_ok=True)
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    state = dict(model.state_dict())
    info: dict[str, Any] = {"original_architectures": archs}
    served_config = dict(config)
    if archs and archs[0] in known:
        info.update(implementation="vllm-native", architecture=archs[0],
                    detail=f"vLLM's own {archs[0]} class serves the model; it ignores the patched modeling code")
        _save(state, out_dir)
        if config.get("model_type") in config_types and isinstance(config.get("auto_map"), dict):
            # vLLM's class was written for the config class its env has for this model type (transformers' own,
            # or vLLM's); the release's configuration file of an older era lacks what that class reads.
            served_config = {k: v for k, v in config.items() if k != "auto_map"}
            info["config"] = (f"config.json read by the vLLM env's own config class for model type "
                              f"{config['model_type']!r}, not the release's configuration code")
        elif isinstance(config.get("auto_map"), dict):  # vLLM loads the config (and tokenizer) class from the code
            for p in code_dir.glob("*.py"):
                shutil.copy2(p, out_dir / p.name)
    elif not backend_only and (layout := decoder_layout(list(state))) is not None:
        arch = layout.architecture
        served_config = layout_config(config, layout,
                                      has_head=any(v == "lm_head.weight" for v in layout.mapping.values()))
        info.update(implementation="vllm-native-layout", architecture=arch, layout=layout.reason,
                    detail=f"vLLM has no class for {', '.join(archs) or 'this model'}; its weights have the layout of "
                           f"vLLM's {arch} ({layout.reason}), so that class serves the renamed weights "
                           f"({_CONFIG_NOTE}; the patched modeling code is not run; the token check decides whether "
                           "the class computes the same)")
        _save(convert(state, layout.mapping), out_dir)
    elif hasattr(model, "save_pretrained") and hasattr(model, "config"):
        info.update(implementation="transformers-backend", architecture=archs[0] if archs else type(model).__name__,
                    detail="vLLM's Transformers backend (--model-impl transformers) runs the patched modeling code",
                    needs=what_vllm_needs(model))  # for the report, should the backend refuse the class
        _save(state, out_dir)
        for p in code_dir.glob("*.py"):
            shutil.copy2(p, out_dir / p.name)
    else:
        info.update(implementation="none", architecture=None, needs=what_vllm_needs(model),
                    detail=f"no vLLM path: vLLM has no class for {', '.join(archs) or type(model).__name__}, the "
                           "weights have no layout of a vLLM class, and the model is not a transformers "
                           "PreTrainedModel the Transformers backend could run")
        return info
    served_config, dropped = without_quantization(served_config)
    if dropped:
        info["quantization"] = (f"the release's quantization_config ({', '.join(dropped)}) is not served: the weights "
                                "saved are the reference's seeded float weights, which vLLM would read as quantized")
    (out_dir / "config.json").write_text(json.dumps(served_config, indent=1))
    tok = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    for n in tok:
        shutil.copy2(model_dir / n, out_dir / n)
    info["tokenizer"] = "tokenizer.json" in tok or "tokenizer.model" in tok or "vocab.json" in tok
    (out_dir / "npuport-servable.json").write_text(json.dumps(info, indent=1))
    return info
