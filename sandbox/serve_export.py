"""The servable folder (runs inside the sandbox): the exact model the reference ran (its shrunk config,
its seeded weights) saved the way vLLM loads a model, and which vLLM implementation can serve it.

Three paths, decided from the model's classes and weight layout, never from its name:

- ``vllm-native``: config.json names an architecture vLLM implements; the state dict is saved as it is.
  vLLM's own class runs, not the model's (patched) code.
- ``vllm-native-layout``: the architecture is unknown to vLLM, but the weights have the Llama-family
  decoder layout (embedding, layers of RMS-normed attention with q/k/v/o projections and a gated MLP,
  final norm, LM head; q/k/v biases make it the Qwen2 layout). The weights are renamed to that layout
  (a fused gate/up projection is split) and the config rewritten to the matching vLLM class. The
  token check through the server decides whether that class computes what the model computes.
- ``transformers-backend``: a transformers ``PreTrainedModel`` vLLM has no class for: saved with its
  (patched) code and served with ``--model-impl transformers``, which runs that code.

Otherwise there is no vLLM path, and :func:`what_vllm_needs` says what a vLLM model class would need.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "vocab.txt", "added_tokens.json", "generation_config.json")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_PARTS = {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"}
_QKV_BIAS = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}
_MLP = ({"mlp.gate_proj.weight", "mlp.up_proj.weight"}, {"mlp.gate_up_proj.weight"})
_CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "rope_theta", "max_position_embeddings", "tie_word_embeddings",
                "pad_token_id", "bos_token_id", "eos_token_id", "head_dim")


def _prefix(names: list[str]) -> str | None:
    """The prefix under which the decoder's ``layers.N.`` live (``""``, ``"model."``, ...)."""
    for name in names:
        m = re.match(r"^(.*?)layers\.\d+\.", name)
        if m:
            return m.group(1)
    return None


def llama_layout(names: list[str]) -> tuple[str, dict[str, str]] | None:
    """(vLLM architecture, {our name: its name}) when the weights have the Llama-family layout, else None.
    A fused ``gate_up_proj`` maps to itself; :func:`convert` splits it."""
    prefix = _prefix(names)
    if prefix is None:
        return None
    layers: dict[int, set[str]] = {}
    mapping: dict[str, str] = {}
    for name in names:
        rest = name[len(prefix):] if name.startswith(prefix) else None
        if name == "lm_head.weight" or rest == "lm_head.weight":
            mapping[name] = "lm_head.weight"
        elif rest in ("embed_tokens.weight", "norm.weight"):
            mapping[name] = f"model.{rest}"
        elif rest is not None and (m := _LAYER.match(rest)):
            layers.setdefault(int(m.group(1)), set()).add(m.group(2))
            mapping[name] = f"model.{rest}"
        else:
            return None  # a weight the layout has no place for
    if "model.embed_tokens.weight" not in mapping.values() or "model.norm.weight" not in mapping.values():
        return None
    if not layers or sorted(layers) != list(range(len(layers))):
        return None
    kinds = set()
    for parts in layers.values():
        mlp = parts - _LAYER_PARTS - _QKV_BIAS
        if not parts >= _LAYER_PARTS or mlp not in _MLP:
            return None
        bias = parts & _QKV_BIAS
        if bias and bias != _QKV_BIAS:
            return None
        kinds.add(bool(bias))
    if len(kinds) != 1:
        return None
    return ("Qwen2ForCausalLM" if kinds.pop() else "LlamaForCausalLM"), mapping


def convert(state: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """The state dict renamed to the layout; a fused gate/up projection split into gate and up (in that
    order, as ``chunk(2)`` splits it)."""
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        new = mapping[name]
        if new.endswith("mlp.gate_up_proj.weight"):
            gate, up = tensor.chunk(2, dim=0)
            out[new.replace("gate_up_proj", "gate_proj")] = gate
            out[new.replace("gate_up_proj", "up_proj")] = up
        else:
            out[new] = tensor
    return out


def layout_config(config: dict[str, Any], arch: str) -> dict[str, Any]:
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}[arch]
    out = {k: config[k] for k in _CONFIG_KEYS if k in config}
    out.setdefault("num_key_value_heads", config.get("num_attention_heads"))
    out.setdefault("tie_word_embeddings", True)
    out.update({"architectures": [arch], "model_type": model_type, "hidden_act": config.get("hidden_act", "silu"),
                "torch_dtype": "float32"})
    return out


def what_vllm_needs(model: Any) -> dict[str, Any]:
    """For a model with no vLLM path: its layer classes (with counts) and its weight names, with layer
    indices folded, which a vLLM model class would have to implement and load."""
    classes: dict[str, int] = {}
    for module in model.modules():
        if not list(module.children()):
            classes[type(module).__name__] = classes.get(type(module).__name__, 0) + 1
    names = sorted({re.sub(r"\.\d+\.", ".N.", n) for n, _ in model.named_parameters()})
    return {"leaf_layers": classes, "weight_names": names[:60], "weight_name_count": len(names)}


def _save(state: dict[str, Any], out_dir: Path) -> None:
    from safetensors.torch import save_file

    # Tied weights share storage; safetensors wants each tensor once, contiguous.
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()},
              str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def export(model: Any, config: dict[str, Any], model_dir: Path, code_dir: Path, out_dir: Path,
           known: set[str]) -> dict[str, Any]:
    """Write the servable folder for ``model`` (built and seeded as the reference was) into ``out_dir``;
    returns {implementation, architecture, detail, tokenizer, ...}. ``code_dir`` holds the ported code;
    ``known`` is the architectures vLLM implements (asked of the vLLM environment)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    state = dict(model.state_dict())
    info: dict[str, Any] = {"original_architectures": archs}
    served_config = dict(config)
    if archs and archs[0] in known:
        info.update(implementation="vllm-native", architecture=archs[0],
                    detail=f"vLLM's own {archs[0]} class serves the model; it ignores the patched modeling code")
        _save(state, out_dir)
        if isinstance(config.get("auto_map"), dict):  # vLLM loads the config (and tokenizer) class from the code
            for p in code_dir.glob("*.py"):
                shutil.copy2(p, out_dir / p.name)
    elif (layout := llama_layout(list(state))) is not None:
        arch, mapping = layout
        served_config = layout_config(config, arch)
        info.update(implementation="vllm-native-layout", architecture=arch,
                    detail=f"vLLM has no class for {', '.join(archs) or 'this model'}; its weights have the "
                           f"{arch} layout, so vLLM's own {arch} serves the renamed weights (the patched modeling "
                           "code is not run; the token check decides whether the class computes the same)")
        _save(convert(state, mapping), out_dir)
    elif hasattr(model, "save_pretrained") and hasattr(model, "config"):
        info.update(implementation="transformers-backend", architecture=archs[0] if archs else type(model).__name__,
                    detail="vLLM's Transformers backend (--model-impl transformers) runs the patched modeling code")
        _save(state, out_dir)
        for p in code_dir.glob("*.py"):
            shutil.copy2(p, out_dir / p.name)
    else:
        info.update(implementation="none", architecture=None, needs=what_vllm_needs(model),
                    detail=f"no vLLM path: vLLM has no class for {', '.join(archs) or type(model).__name__}, the "
                           "weights have no layout of a vLLM class, and the model is not a transformers "
                           "PreTrainedModel the Transformers backend could run")
        return info
    (out_dir / "config.json").write_text(json.dumps(served_config, indent=1))
    tok = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    for n in tok:
        shutil.copy2(model_dir / n, out_dir / n)
    info["tokenizer"] = "tokenizer.json" in tok or "tokenizer.model" in tok or "vocab.json" in tok
    (out_dir / "npuport-servable.json").write_text(json.dumps(info, indent=1))
    return info
