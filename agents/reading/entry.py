"""How to run a model: the entry class, its config, sample inputs and the method to call.

Three sources, in order (docs/architecture.md, "Model manifest"):
1. ``npuport.yaml`` in the model root, validated with pydantic;
2. HF ``config.json`` with ``auto_map`` (AutoModelForCausalLM, AutoModel, ...), resolved to
   ``modeling_x.py`` and checked by parsing it (never importing it);
3. a generated manifest: the single top-level ``nn.Module`` subclass with a ``forward``, with
   every guess written down in ``assumptions``.

Model code is only parsed with ``ast``, never imported: it may need CUDA or be hostile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents.reading.entry_run import _find_inputs, _preprocessing_method, _run_method
from agents.reading.entry_source import (
    MANIFEST_NAME,
    _auto_map_key,
    _check_class,
    _check_function,
    _module_classes,
    _package_classes,
    _parse,
    _python_files,
    _read_config,
    _split_auto_ref,
)
from agents.reading.quant_path import quantized_path
from knowledge.errors import EntryNotFound, ManifestError, UntrustedValue
from knowledge.untrusted import RelPath, inside

DEFAULT_RUN_KWARGS: dict[str, Any] = {"max_new_tokens": 8}


# ----------------------------------------------------------------------------------------------
# Manifest schema
# ----------------------------------------------------------------------------------------------

_REF = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # module:attr


class EntrySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    class_: str | None = Field(default=None, alias="class", pattern=_REF)
    auto_map: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> EntrySpec:
        if (self.class_ is None) == (self.auto_map is None):
            raise ValueError("give exactly one of 'class' (module:Class) or 'auto_map' (e.g. AutoModelForCausalLM)")
        return self


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: str = Field(default="generate", pattern=r"^[A-Za-z_]\w*$")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    # The method called once per decode step (per-step op and host-sync counts); default: forward.
    step: str | None = Field(default=None, pattern=r"^[A-Za-z_]\w*$")
    # The model's own preprocessing method (infer-style, takes a tokenizer): when set and there is no
    # inputs function, its generate call is intercepted and those arguments are the inputs. The value
    # "AutoProcessor" means the folder's processor instead (sandbox/inputs/model_inputs.py).
    preprocess: str | None = Field(default=None, pattern=r"^[A-Za-z_]\w*$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    entry: EntrySpec
    config: RelPath = "config.json"  # inside the model's folder (knowledge/untrusted.py): never a path out of it
    inputs: str = Field(pattern=_REF)
    decode: str | None = Field(default=None, pattern=_REF)
    run: RunSpec = Field(default_factory=RunSpec)
    shrink: dict[str, Any] = Field(default_factory=dict)


class EntryInfo(BaseModel):
    """What the harness needs to build and run the model."""

    kind: Literal["manifest", "auto_map", "generated"]
    name: str
    module: str  # dotted, relative to the model root: "modeling_ocr_mini"
    module_file: str  # posix path relative to the model root
    class_name: str
    config_path: str | None = None  # relative to the model root
    inputs_fn: str | None = None  # "module:function"
    decode_fn: str | None = None
    run_method: str = "generate"
    run_kwargs: dict[str, Any] = Field(default_factory=dict)
    run_step: str | None = None
    run_preprocess: str | None = None
    shrink: dict[str, Any] = Field(default_factory=dict)
    assumptions: list[str] = Field(default_factory=list)
    # A quantized release: the float path built instead (agents/reading/quant_path.py), config values every run uses
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    quantized: dict[str, Any] | None = None

    def as_manifest_dict(self) -> dict[str, Any]:
        """The manifest (docs/architecture.md) this entry amounts to."""
        out: dict[str, Any] = {"name": self.name, "entry": {"class": f"{self.module}:{self.class_name}"}}
        if self.config_path is not None:
            out["config"] = self.config_path
        if self.inputs_fn is not None:
            out["inputs"] = self.inputs_fn
        if self.decode_fn is not None:
            out["decode"] = self.decode_fn
        out["run"] = {"method": self.run_method, "kwargs": dict(self.run_kwargs)}
        if self.run_step:
            out["run"]["step"] = self.run_step
        if self.run_preprocess:
            out["run"]["preprocess"] = self.run_preprocess
        out["shrink"] = dict(self.shrink)
        if self.config_overrides:
            out["config_overrides"] = dict(self.config_overrides)
        if self.quantized:
            out["quantized"] = dict(self.quantized)
        return out


# ----------------------------------------------------------------------------------------------
# Discovery
# ----------------------------------------------------------------------------------------------

def discover_entry(root: Path) -> EntryInfo:
    root = Path(root)
    if not root.is_dir():
        raise EntryNotFound(f"{root} is not a directory")
    if (root / MANIFEST_NAME).is_file():
        return _from_manifest(root)
    py_files = _python_files(root)
    if not py_files:
        raise EntryNotFound(f"no Python files under {root}, so there is no model class to run")
    config = _read_config(root / "config.json", root) if (root / "config.json").is_file() else None
    if config is not None and isinstance(config.get("auto_map"), dict) and _auto_map_key(config["auto_map"]):
        return _from_auto_map(root, config)
    return _generated(root, py_files, config)


def _from_manifest(root: Path) -> EntryInfo:
    try:
        raw = yaml.safe_load((root / MANIFEST_NAME).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ManifestError(f"{MANIFEST_NAME}: not valid YAML{where}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{MANIFEST_NAME}: must be a mapping with name, entry, inputs, ...")
    try:
        m = Manifest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ManifestError(f"{MANIFEST_NAME}: {field}: {err['msg']}") from exc
    assumptions: list[str] = []
    try:
        config_path = inside(root, m.config, "config")  # a link out of the folder is refused like a '..'
    except UntrustedValue as exc:
        raise ManifestError(f"{MANIFEST_NAME}: {exc}") from exc
    if not config_path.is_file():
        raise ManifestError(f"{MANIFEST_NAME}: config: {m.config} does not exist")
    if m.entry.class_ is not None:
        module, cls = m.entry.class_.split(":")
        module_file = _check_class(root, module, cls, field="entry.class")
    else:
        config = _read_config(config_path, root.resolve())
        auto, key = config.get("auto_map"), m.entry.auto_map or ""
        if not isinstance(auto, dict) or key not in auto:
            raise ManifestError(f"{MANIFEST_NAME}: entry.auto_map: {m.config} has no auto_map entry {key!r}")
        module, cls = _split_auto_ref(auto[key], key)
        module_file = _check_class(root, module, cls, field="entry.auto_map")
        assumptions.append(f"entry resolved through {m.config} auto_map[{key!r}] -> {module}.{cls}")
    for field, ref in (("inputs", m.inputs), ("decode", m.decode)):
        if ref is not None:
            mod, fn = ref.split(":")
            _check_function(root, mod, fn, field=field)
    return EntryInfo(kind="manifest", name=m.name, module=module, module_file=module_file, class_name=cls,
                     config_path=m.config, inputs_fn=m.inputs, decode_fn=m.decode, run_method=m.run.method,
                     run_kwargs=m.run.kwargs, run_step=m.run.step, run_preprocess=m.run.preprocess,
                     shrink=m.shrink, assumptions=assumptions)


def _from_auto_map(root: Path, config: dict[str, Any]) -> EntryInfo:
    auto: dict[str, Any] = config["auto_map"]
    key = _auto_map_key(auto)
    assert key is not None
    module, cls = _split_auto_ref(auto[key], key)
    module_file = _check_class(root, module, cls, field=f"config.json auto_map[{key!r}]", manifest=False)
    assumptions = [f"entry from config.json auto_map[{key!r}] -> {module}.{cls}"]
    tree = _parse(root / module_file, root)
    quant = quantized_path(root, _package_classes(root, tree, module_file), cls, config)  # agents/reading/quant_path.py
    if quant is not None and quant.float_class:
        cls = quant.float_class
    if quant is not None:
        assumptions.append(quant.assumption())
    method = _run_method(tree, cls, assumptions, _package_classes(root, tree, module_file), auto_key=key)
    inputs, decode = _find_inputs(root, assumptions, synthesise=True)
    preprocess = _preprocessing_method(root, cls, _package_classes(root, tree, module_file), assumptions) \
        if inputs is None else None
    name = str(config.get("model_type") or root.name)
    if isinstance(auto.get("AutoConfig"), str | list):
        assumptions.append(f"config built through config.json auto_map['AutoConfig'] -> {auto['AutoConfig']}")
    assumptions.append("the model folder is imported as a package (relative imports resolve, as transformers' "
                       "remote-code loader does)")
    assumptions.append("--shrink derives a small config from config.json (sandbox/harness/shrink.py); no manifest "
                       "overrides")
    kwargs = dict(DEFAULT_RUN_KWARGS) if method == "generate" else {}
    if method == "generate" and any("inherits generate from transformers" in a for a in assumptions):
        kwargs["do_sample"] = False  # greedy whatever the generation config says
    return EntryInfo(kind="auto_map", name=name, module=module, module_file=module_file, class_name=cls,
                     config_path="config.json", inputs_fn=inputs, decode_fn=decode, run_method=method,
                     run_kwargs=kwargs, run_preprocess=preprocess, assumptions=assumptions,
                     config_overrides=quant.overrides if quant else {}, quantized=quant.as_dict() if quant else None)



def _generated(root: Path, py_files: list[Path], config: dict[str, Any] | None) -> EntryInfo:
    trees = {p: _parse(p, root) for p in py_files}  # a syntax error anywhere stops here, with file:line
    classes = _module_classes(trees, root)
    if not classes:
        raise EntryNotFound("no nn.Module subclass with a forward method in the model's Python files")
    referenced: set[str] = set()
    bases: set[str] = set()
    for c in classes.values():
        bases |= {b.rsplit(".", 1)[-1] for b in c.bases}
        referenced |= {n for n in c.names_used if n != c.name}
    roots = [c for c in classes.values() if c.name not in referenced and c.name not in bases] or \
        [c for c in classes.values() if c.name not in bases] or list(classes.values())
    roots.sort(key=lambda c: (not c.has_generate, not c.name.endswith(("ForCausalLM", "ForConditionalGeneration",
                                                                        "LMHeadModel", "Model")), -c.size, c.name))
    pick = roots[0]
    assumptions = [f"no {MANIFEST_NAME} and no config.json auto_map: picked {pick.name} in {pick.file}, "
                   f"a top-level nn.Module with a forward"]
    if len(roots) > 1:
        others = ", ".join(c.name for c in roots[1:6])
        assumptions.append(f"other top-level candidates: {others} (preferred one with generate, then a "
                           "*ForCausalLM/*Model name, then the largest)")
    module = pick.file.removesuffix(".py").replace("/", ".")
    method = "generate" if pick.has_generate else "forward"
    if method == "forward":
        assumptions.append(f"{pick.name} has no generate: runs forward, whose output is not greedy token ids")
    config_path = "config.json" if config is not None else None
    if config_path is None:
        assumptions.append("no config.json: the class is built with an empty config dict")
    inputs, decode = _find_inputs(root, assumptions, synthesise=True)
    preprocess = _preprocessing_method(root, pick.name, _package_classes(root, trees[root / pick.file], pick.file),
                                       assumptions) if inputs is None else None
    assumptions.append("--shrink derives a small config from config.json (sandbox/harness/shrink.py); no manifest "
                       "overrides")
    name = str((config or {}).get("model_type") or root.name)
    return EntryInfo(kind="generated", name=name, module=module, module_file=pick.file, class_name=pick.name,
                     config_path=config_path, inputs_fn=inputs, decode_fn=decode, run_method=method,
                     run_kwargs=dict(DEFAULT_RUN_KWARGS) if method == "generate" else {}, run_preprocess=preprocess,
                     assumptions=assumptions)
