"""Sub-models a config names by Hub id, built offline.

A composite release (an audio or vision LLM) may keep only the id of a sub-model in config.json
(``"text_model_id": "meta-llama/Llama-3.1-8B-Instruct"``) and fetch that sub-model's config, or its
weights, from the Hugging Face Hub while it is constructed (``AutoConfig.from_pretrained(text_model_id)``,
``AutoModelForCausalLM.from_pretrained(...)``). The sandbox has no network, and npuport's runs use random
weights anyway. So, in the harness, a ``from_pretrained`` of a Hub id that is neither a local folder nor in
the local cache builds the sub-model offline instead: transformers' own config class for the model type
the id names (``llama`` in ``Llama-3.1-8B-Instruct``), with its defaults, the vocabulary of the model's own
config.json (its token ids must stay valid), shrunk under ``--shrink`` by the same rules as config.json;
a model is built from that config with random weights (seeded later like every other parameter). Each such
build is listed (``built_offline``) and the report names it. The reference and the port get the same.

Runs inside the sandbox harness; imports nothing of agents/graph."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Keys of the model's own config.json that describe the sub-model's vocabulary: the ids its inputs use.
VOCAB_KEYS = re.compile(r"^(vocab_size|(bos|eos|pad|unk)_token_id)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class HubOffline:
    """The state of the offline builds of one harness run: the model's config.json (for the vocabulary),
    whether to shrink, and the notes."""

    def __init__(self, model_dir: Path, config: dict[str, Any], shrink: bool) -> None:
        self.model_dir = Path(model_dir)
        self.config = config
        self.shrink = shrink
        self.notes: list[str] = []
        self._built: dict[str, Any] = {}

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def offline_config(self, hub_id: str, config_cls: Any = None) -> Any:
        """transformers' config for the model type ``hub_id`` names (or ``config_cls``, a concrete config class
        the code asked for), its defaults, this model's vocabulary, shrunk under --shrink."""
        if hub_id in self._built:
            return self._built[hub_id]
        from transformers import CONFIG_MAPPING

        model_type = getattr(config_cls, "model_type", "") or model_type_of(hub_id, list(CONFIG_MAPPING.keys()))
        if not model_type:
            raise OSError(f"{hub_id} is a Hugging Face Hub id the model fetches at construction; the sandbox has no "
                          "network and no model type of this transformers matches its name, so npuport cannot build "
                          "it offline: add an npuport.yaml whose config holds the sub-model's config")
        cls = config_cls if getattr(config_cls, "model_type", "") else CONFIG_MAPPING[model_type]
        import json

        values = json.loads(cls().to_json_string(use_diff=False))  # plain JSON, as config.json would hold it
        kept = {k: v for k, v in self.config.items() if VOCAB_KEYS.match(k) and isinstance(v, int)
                and not isinstance(v, bool) and k in values}
        values.update(kept)
        changes: list[str] = []
        if self.shrink:
            from sandbox.harness.shrink import shrink_config

            values, changes = shrink_config(values, {}, self.model_dir)
        config = cls.from_dict(values)
        self._built[hub_id] = config
        self.note(f"{hub_id}: a Hub id the model's code fetches at construction (no network here): built offline as "
                  f"transformers' {cls.__name__} (model type '{model_type}', named in the id) with its defaults"
                  + (f", {', '.join(f'{k} {v}' for k, v in kept.items())} from config.json" if kept else "")
                  + (f", shrunk ({'; '.join(changes)})" if changes else "") + "; random weights, like every run")
        return config


def model_type_of(hub_id: str, model_types: list[str]) -> str | None:
    """The model type a Hub id names: the longest of ``model_types`` its repository name starts with, or holds
    after a separator, followed by a non-letter ("Llama-3.1-8B-Instruct" -> "llama", "whisper-large-v3" ->
    "whisper", "Qwen2.5-7B" -> "qwen2")."""
    name = hub_id.rsplit("/", 1)[-1].lower().replace("_", "-")
    best: str | None = None
    for mt in model_types:
        t = mt.lower().replace("_", "-")
        if re.search(rf"(^|[-.]){re.escape(t)}($|[^a-z])", name) and (best is None or len(t) > len(best)):
            best = mt
    return best


def is_hub_id(name: Any) -> bool:
    """``org/name``, not a folder or file here."""
    return isinstance(name, str) and bool(_HUB_ID.match(name)) and not Path(name).exists()


def install(model_dir: Path, config: dict[str, Any], shrink: bool) -> HubOffline:
    """Patch transformers' ``from_pretrained`` (configs, Auto model classes, PreTrainedModel) so that a Hub id
    absent from the local cache is built offline; returns the run's state (its ``notes``)."""
    from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

    state = HubOffline(model_dir, config, shrink)

    def offline(fn: Any, kind: str) -> Any:
        def wrapper(cls: Any, name: Any = None, *args: Any, **kwargs: Any) -> Any:
            if not is_hub_id(name):
                return fn.__get__(cls)(name, *args, **kwargs) if name is not None else fn.__get__(cls)(*args, **kwargs)
            try:  # the local cache first: what the authors' machine would have found
                return fn.__get__(cls)(name, *args, **{**kwargs, "local_files_only": True})
            except Exception:  # not cached: built offline below
                pass
            auto = hasattr(cls, "from_config") or cls is AutoConfig
            concrete = None if auto else (cls if kind == "config" else getattr(cls, "config_class", None))
            sub = state.offline_config(name, concrete)
            if kind == "config":
                if kwargs.get("return_unused_kwargs"):  # transformers' own callers ask for (config, the rest)
                    return sub, {k: v for k, v in kwargs.items() if k not in _LOADING_KWARGS}
                return sub
            build_kwargs = {k: v for k, v in kwargs.items() if k in ("torch_dtype", "attn_implementation")}
            if hasattr(cls, "from_config"):  # an Auto class
                return cls.from_config(sub, **build_kwargs)
            return cls._from_config(sub, **build_kwargs)

        return classmethod(wrapper)

    AutoConfig.from_pretrained = offline(AutoConfig.__dict__["from_pretrained"].__func__, "config")  # type: ignore[method-assign]
    PretrainedConfig.from_pretrained = offline(  # type: ignore[method-assign]
        PretrainedConfig.__dict__["from_pretrained"].__func__, "config")
    PreTrainedModel.from_pretrained = offline(  # type: ignore[method-assign]
        PreTrainedModel.__dict__["from_pretrained"].__func__, "model")
    # Each Auto model class holds its own copy of from_pretrained (transformers' auto_class_update).
    from transformers.models.auto import auto_factory, modeling_auto

    base = getattr(auto_factory, "_BaseAutoModelClass", None)
    autos = [base] + [v for v in vars(modeling_auto).values() if isinstance(v, type) and base is not None
                      and issubclass(v, base)]
    for auto in autos:
        if auto is not None and "from_pretrained" in auto.__dict__:
            auto.from_pretrained = offline(auto.__dict__["from_pretrained"].__func__, "model")
    return state


# Arguments that steer where a config is loaded from, not the model built from it.
_LOADING_KWARGS = frozenset({"return_unused_kwargs", "local_files_only", "cache_dir", "revision", "token",
                             "use_auth_token", "force_download", "resume_download", "proxies", "subfolder",
                             "trust_remote_code", "code_revision", "_from_auto", "_from_pipeline", "name_or_path"})
