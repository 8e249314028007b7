"""Building the model as transformers builds remote code: the model folder imported as a package, the
config through its config class (config.json's ``auto_map["AutoConfig"]``), ``cls._from_config``, the
GenerationMixin the Auto classes add, the --shrink config fitted to the constructor, and Hub sub-models
built offline. Used by the harness, the bench and the serving reference inside the sandbox."""

from __future__ import annotations

import copy
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sandbox.inputs.inputs_base import with_folder_token_ids

MODEL_PACKAGE = "npuport_model"  # the synthetic package the model folder is imported as


def register_model_package(model_dir: Path) -> None:
    """Import the model folder as a package, as transformers' dynamic module loader does, so that its
    modules' relative imports (``from .configuration_x import XConfig``) resolve. Absolute imports
    still work through sys.path."""
    pkg = ModuleType(MODEL_PACKAGE)
    pkg.__path__ = [str(model_dir)]
    pkg.__file__ = str(model_dir / "__init__.py")
    pkg.__package__ = MODEL_PACKAGE
    sys.modules[MODEL_PACKAGE] = pkg


def _load_attr(spec: str, model_dir: Path) -> Any:
    module_name, _, attr = spec.partition(":")
    if not attr:
        module_name, _, attr = spec.rpartition(".")
    in_model = _module_in(model_dir, module_name)
    if in_model and MODEL_PACKAGE not in sys.modules:
        register_model_package(model_dir)
    module = importlib.import_module(f"{MODEL_PACKAGE}.{module_name}" if in_model else module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _module_in(model_dir: Path, module_name: str) -> bool:
    base = model_dir / Path(*module_name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def load_config(model_dir: Path, manifest: dict[str, Any], *, shrink: bool, overrides: dict[str, Any] | None = None,
                build: Any = None, configure: Any = None,
                run_config: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """config.json as a dict; under ``shrink`` a derived small config (sandbox/harness/shrink.py) with the
    manifest's ``shrink:`` overrides on top, and the list of what was shrunk; with ``build`` (config ->
    model) the one the model's constructor accepts (sandbox/harness/shrink_fit.py), and with ``configure``
    (config -> the config object the model is built from) the sizes its config class fills in by default
    shrunk too. Without ``shrink``, a config too large for this machine's memory is refused with a message
    naming --shrink. ``run_config`` (the config a port ran with, its bundle's run_config.json) is used as
    it is, ``overrides`` on top: the small config is worked out once, by the port's runs, never again."""
    from sandbox.cuda_redirect.cuda_only import kernel_flags_off
    from sandbox.harness.shrink import estimate_params, shrink_config

    if run_config is not None:
        return {**run_config, **(overrides or {})}, ["the config the port ran with (run_config.json), as it is"]

    config: dict[str, Any] = json.loads((model_dir / manifest.get("config", "config.json")).read_text())
    flags = kernel_flags_off(config)  # "flash_attn": true names a kernel neither the CPU nor Ascend has
    # The manifest's config_overrides hold for every run (a quantization switch turned off:
    # agents/reading/quant_path.py)
    extra = {**(manifest.get("config_overrides") or {}), **(overrides or {})}
    changes: list[str] = []
    if shrink and build is not None:
        from sandbox.harness.shrink_fit import fit_to_constructor, sized_by_class_defaults

        config, defaults = sized_by_class_defaults(config, configure)
        small, changes = fit_to_constructor(build, config, manifest.get("shrink") or {}, model_dir, extra)
        return small, [*flags, *defaults, *changes]
    if shrink:
        config, changes = shrink_config(config, manifest.get("shrink") or {}, model_dir)
        changes = [*flags, *changes]
    else:
        changes = flags
        params = estimate_params(config)
        need = params * 4  # built in float32 before any dtype cast
        avail = _available_memory()
        if avail and need > 0.8 * avail:
            raise MemoryError(f"the model's config describes about {params / 1e9:.2f}B parameters "
                              f"({need / 2**30:.1f} GiB in float32) but {avail / 2**30:.1f} GiB of memory is "
                              "available: rerun with --shrink (a small config derived from config.json, random "
                              "weights)")
    config.update(extra)
    return config, changes


def _hub_offline(model_dir: Path, manifest: dict[str, Any], shrink: bool) -> Any:
    """Hub ids the model's code fetches at construction, built offline (sandbox/harness/hub_offline.py); None
    without transformers."""
    try:
        from sandbox.harness.hub_offline import install

        config = json.loads((model_dir / manifest.get("config", "config.json")).read_text())
        return install(model_dir, config if isinstance(config, dict) else {}, shrink)
    except ImportError:
        return None


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _auto_ref(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        value = next((v for v in value if v), None)
    if not isinstance(value, str) or "." not in value:
        return None
    module, _, name = value.split("--", 1)[-1].rpartition(".")
    return f"{module}:{name}"


def config_class(cls: Any, config: dict[str, Any], model_dir: Path) -> Any:
    """The PretrainedConfig class the model is built through: config.json's ``auto_map["AutoConfig"]``, else the
    model class's own ``config_class``; None for a plain nn.Module that takes the dict."""
    auto = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else {}
    ref = _auto_ref(auto.get("AutoConfig")) if auto else None
    found: Any = _load_attr(ref, model_dir) if ref else None
    if found is None:
        candidate = getattr(cls, "config_class", None)
        if isinstance(candidate, type) and hasattr(candidate, "from_dict"):
            found = candidate
    return found


def config_object(cls: Any, config: dict[str, Any], model_dir: Path) -> Any:
    """The config object ``build_model`` builds the model from (None for a plain nn.Module)."""
    config_cls = config_class(cls, config, model_dir)
    return None if config_cls is None else config_cls(**copy.deepcopy(config))


def build_model(cls: Any, config: dict[str, Any], model_dir: Path) -> Any:
    """Build the model as transformers does for remote code: the config through config.json's
    ``auto_map["AutoConfig"]`` (else the class's own ``config_class``) into its PretrainedConfig
    class, then ``cls._from_config``; a plain nn.Module gets the dict (``cls(config)``)."""
    config_cls = config_class(cls, config, model_dir)
    if config_cls is None:
        return cls(config)
    # from a copy, as from_dict builds from the file each time: a config class may pop its sub-config dicts
    config_obj = config_cls(**copy.deepcopy(config))
    if hasattr(cls, "_from_config"):
        return with_folder_token_ids(with_generation_mixin(cls)._from_config(config_obj), model_dir)
    return cls(config_obj)


def with_generation_mixin(cls: Any) -> Any:
    """The class as transformers' Auto classes hand out remote code (``trust_remote_code=True``): a
    generative PreTrainedModel that relied on inheriting generate (it defines its own
    prepare_inputs_for_generation or generate) gets GenerationMixin among its bases, the way the model's
    authors loaded it (``auto_factory.add_generation_mixin_to_remote_model``, transformers >= 4.45)."""
    try:
        from transformers.models.auto.auto_factory import add_generation_mixin_to_remote_model
    except ImportError:  # older releases: PreTrainedModel itself inherits GenerationMixin
        return cls
    return add_generation_mixin_to_remote_model(cls)
