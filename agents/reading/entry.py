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

import ast
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents.reading.quant_path import quantized_path
from knowledge.errors import EntryNotFound, ManifestError
from sandbox.model_inputs import PROCESSOR_FILES, PROCESSOR_PATH, TOKENIZER_FILES

MANIFEST_NAME = "npuport.yaml"
# auto_map keys tried in order; the first the config names wins.
AUTO_MAP_PREFERENCE = ("AutoModelForCausalLM", "AutoModelForVision2Seq", "AutoModelForImageTextToText",
                       "AutoModelForSeq2SeqLM", "AutoModel")
NOT_MODEL_AUTO_KEYS = ("AutoConfig", "AutoTokenizer", "AutoProcessor", "AutoImageProcessor",
                       "AutoFeatureExtractor", "AutoVideoProcessor")
INPUT_FN_NAMES = ("make_inputs", "sample_inputs", "get_inputs", "example_inputs")
MODULE_BASES = {"Module", "PreTrainedModel", "GenerationMixin"}
SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "env", "node_modules", "site-packages", "tests", "test"}
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
    # "AutoProcessor" means the folder's processor instead (sandbox/model_inputs.py).
    preprocess: str | None = Field(default=None, pattern=r"^[A-Za-z_]\w*$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    entry: EntrySpec
    config: str = "config.json"
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
    config = _read_config(root / "config.json") if (root / "config.json").is_file() else None
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
    config_path = root / m.config
    if not config_path.is_file():
        raise ManifestError(f"{MANIFEST_NAME}: config: {m.config} does not exist")
    if m.entry.class_ is not None:
        module, cls = m.entry.class_.split(":")
        module_file = _check_class(root, module, cls, field="entry.class")
    else:
        config = _read_config(config_path)
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
    method = _run_method(tree, cls, assumptions, _package_classes(root, tree, module_file))
    inputs, decode = _find_inputs(root, assumptions, synthesise=True)
    preprocess = _preprocessing_method(root, cls, _package_classes(root, tree, module_file), assumptions) \
        if inputs is None else None
    name = str(config.get("model_type") or root.name)
    if isinstance(auto.get("AutoConfig"), str | list):
        assumptions.append(f"config built through config.json auto_map['AutoConfig'] -> {auto['AutoConfig']}")
    assumptions.append("the model folder is imported as a package (relative imports resolve, as transformers' "
                       "remote-code loader does)")
    assumptions.append("--shrink derives a small config from config.json (sandbox/shrink.py); no manifest overrides")
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
    assumptions.append("--shrink derives a small config from config.json (sandbox/shrink.py); no manifest overrides")
    name = str((config or {}).get("model_type") or root.name)
    return EntryInfo(kind="generated", name=name, module=module, module_file=pick.file, class_name=pick.name,
                     config_path=config_path, inputs_fn=inputs, decode_fn=decode, run_method=method,
                     run_kwargs=dict(DEFAULT_RUN_KWARGS) if method == "generate" else {}, run_preprocess=preprocess,
                     assumptions=assumptions)


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def _python_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            continue
        if rel[-1].startswith("test_") or rel[-1] in ("conftest.py", "setup.py"):
            continue
        out.append(p)
    return out


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EntryNotFound(f"{path.name} is not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise EntryNotFound(f"{path.name} must hold a JSON object")
    return data


def _auto_map_key(auto: dict[str, Any]) -> str | None:
    for key in AUTO_MAP_PREFERENCE:
        if auto.get(key):
            return key
    return next((k for k, v in auto.items() if k.startswith("AutoModel") and v and k not in NOT_MODEL_AUTO_KEYS),
                None)


def _split_auto_ref(value: Any, key: str) -> tuple[str, str]:
    """'modeling_x.Class' (or 'user/repo--modeling_x.Class', or a list of such) -> (module, class)."""
    if isinstance(value, list | tuple):
        value = next((v for v in value if v), None)
    if not isinstance(value, str) or "." not in value:
        raise EntryNotFound(f"config.json auto_map[{key!r}] should be 'module.Class', got {value!r}")
    value = value.split("--", 1)[-1]
    module, _, cls = value.rpartition(".")
    return module, cls


def _module_file(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parse(path: Path, root: Path) -> ast.Module:
    rel = path.relative_to(root).as_posix()
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    except SyntaxError as exc:
        raise EntryNotFound(f"syntax error in the model: {rel}:{exc.lineno}: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise EntryNotFound(f"{rel} is not UTF-8 text") from exc


def _check_class(root: Path, module: str, cls: str, *, field: str, manifest: bool = True) -> str:
    """The module file (posix, relative) after checking it defines or imports cls."""
    prefix = f"{MANIFEST_NAME}: {field}" if manifest else field
    path = _module_file(root, module)
    if path is None:
        raise (ManifestError if manifest else EntryNotFound)(f"{prefix}: no module {module} "
                                                             f"({module.replace('.', '/')}.py) under the model root")
    tree = _parse(path, root)
    rel = path.relative_to(root).as_posix()
    if cls not in _top_level_names(tree):
        raise (ManifestError if manifest else EntryNotFound)(f"{prefix}: {rel} has no class {cls}")
    return rel


def _check_function(root: Path, module: str, fn: str, *, field: str) -> None:
    path = _module_file(root, module)
    if path is None:
        raise ManifestError(f"{MANIFEST_NAME}: {field}: no module {module} ({module.replace('.', '/')}.py)")
    if fn not in _top_level_names(_parse(path, root)):
        raise ManifestError(f"{MANIFEST_NAME}: {field}: {path.relative_to(root).as_posix()} has no function {fn}")


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines or imports at top level (classes, functions, assignments)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _package_classes(root: Path, tree: ast.Module, module_file: str) -> dict[str, ast.ClassDef]:
    """Top-level classes of a module and of the modules it imports relatively (``from .x import Base``),
    transitively: a remote-code model's bases often live in a sibling module."""
    classes: dict[str, ast.ClassDef] = {}
    seen: set[str] = set()
    todo: list[tuple[ast.Module, str]] = [(tree, module_file)]
    while todo:
        mod_tree, rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for node in mod_tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                path = _module_file(root, node.module)
                if path is not None and path.relative_to(root).as_posix() not in seen:
                    try:
                        todo.append((_parse(path, root), path.relative_to(root).as_posix()))
                    except EntryNotFound:
                        continue
    return classes


def _run_method(tree: ast.Module, cls: str, assumptions: list[str],
                classes: dict[str, ast.ClassDef] | None = None) -> str:
    classes = classes or {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for _, node in _local_hierarchy(classes, cls):
        if any(isinstance(b, ast.FunctionDef) and b.name == "generate" for b in node.body):
            return "generate"
        for b in node.bases:
            base = _base_name(b)
            if base.endswith(("PreTrainedModel", "GenerationMixin")) and base not in classes:
                assumptions.append(f"{cls} inherits generate from transformers ({base}); HF generate returns "
                                   "the prompt and the new tokens")
                return "generate"
    assumptions.append(f"{cls} has no generate: runs forward, whose output is not greedy token ids")
    return "forward"


def _local_hierarchy(classes: dict[str, ast.ClassDef], cls: str) -> Iterator[tuple[str, ast.ClassDef]]:
    """``cls`` and its base classes defined in the model's own files (each once), nearest first."""
    seen: set[str] = set()
    todo = [cls]
    while todo:
        name = todo.pop().rsplit(".", 1)[-1]
        node = classes.get(name)
        if node is None or name in seen:
            continue
        seen.add(name)
        yield name, node
        todo += [_base_name(b) for b in reversed(node.bases)]


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_base_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return ""


class _ClassInfo(BaseModel):
    name: str
    file: str
    bases: list[str]
    has_forward: bool
    has_generate: bool
    size: int
    names_used: set[str]


def _module_classes(trees: dict[Path, ast.Module], root: Path) -> dict[str, _ClassInfo]:
    """Top-level classes that are nn.Modules (directly or through a local base) and have a forward."""
    infos: dict[str, _ClassInfo] = {}
    for path, tree in trees.items():
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {b.name for b in node.body if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)}
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
                   {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            infos[node.name] = _ClassInfo(name=node.name, file=path.relative_to(root).as_posix(),
                                          bases=[_base_name(b) for b in node.bases],
                                          has_forward="forward" in methods, has_generate="generate" in methods,
                                          size=(node.end_lineno or node.lineno) - node.lineno, names_used=used)

    def is_module(c: _ClassInfo, seen: frozenset[str] = frozenset()) -> bool:
        for b in c.bases:
            last = b.rsplit(".", 1)[-1]
            if last in MODULE_BASES or last.endswith("PreTrainedModel"):
                return True
            local = infos.get(last)
            if local is not None and last not in seen and is_module(local, seen | {c.name}):
                return True
        return False

    def has(c: _ClassInfo, attr: str, seen: frozenset[str] = frozenset()) -> bool:
        if getattr(c, attr):
            return True
        return any(b.rsplit(".", 1)[-1] in infos and b not in seen and has(infos[b.rsplit(".", 1)[-1]], attr,
                                                                            seen | {c.name}) for b in c.bases)

    out = {}
    for name, c in infos.items():
        if is_module(c) and has(c, "has_forward"):
            out[name] = c.model_copy(update={"has_generate": has(c, "has_generate")})
    return out


INPUTS_HOOK = "npuport_inputs.py"  # the documented inputs hook, looked at first
PREPROCESS_METHODS = ("infer", "chat", "preprocess", "process_inputs", "prepare_inputs")


def _preprocessing_method(root: Path, cls: str, classes: dict[str, ast.ClassDef],
                          assumptions: list[str]) -> str | None:
    """The model's own preprocessing path: an infer-style method of the class (or a local base) that
    takes a tokenizer, else the folder's processor (AutoProcessor) when its files are there. The harness
    drives it for the inputs (sandbox/model_inputs.py)."""
    for name, node in _local_hierarchy(classes, cls):
        for fn in node.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in PREPROCESS_METHODS and \
                    any(a.arg == "tokenizer" for a in fn.args.args):
                have = [f for f in TOKENIZER_FILES if (root / f).is_file()]
                if have:
                    tok = f"the folder's tokenizer ({', '.join(have)})"
                elif (root / "tokenizer_config.json").is_file():
                    tok = ("the folder's tokenizer if AutoTokenizer loads it from tokenizer_config.json (no "
                           f"{', '.join(TOKENIZER_FILES)}), else a stand-in tokenizer (character ids, the special "
                           "tokens of tokenizer_config.json)")
                else:
                    tok = (f"a stand-in tokenizer (no {', '.join(TOKENIZER_FILES)} in the folder: character ids, "
                           "the special tokens of tokenizer_config.json)")
                assumptions.append(f"inputs come from the model's own preprocessing path {name}.{fn.name}(tokenizer, "
                                   f"...) ({_rel_of(root, node)}:{fn.lineno}) with {tok}, a test prompt and a test "
                                   "image: its generate call is intercepted and its arguments are the inputs "
                                   "(docs/architecture.md, Inputs when the model has none)")
                return fn.name
    have_processor = [f for f in PROCESSOR_FILES if (root / f).is_file()]
    have_tokenizer = [f for f in TOKENIZER_FILES if (root / f).is_file()]
    if have_processor and have_tokenizer:
        assumptions.append(f"inputs come from the folder's own processor (AutoProcessor: {', '.join(have_processor)}, "
                           f"{', '.join(have_tokenizer)}) on a test prompt and a test image, through its chat "
                           "template when it has one (docs/architecture.md, Inputs when the model has none)")
        return PROCESSOR_PATH
    if have_processor:
        assumptions.append(f"the folder has a processor config ({', '.join(have_processor)}) but no tokenizer file "
                           f"({', '.join(TOKENIZER_FILES)}), so its processor cannot be loaded; inputs are synthesised")
    return None


def _rel_of(root: Path, node: ast.ClassDef) -> str:
    for path in _python_files(root):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if any(isinstance(n, ast.ClassDef) and n.name == node.name and n.lineno == node.lineno for n in tree.body):
            return path.relative_to(root).as_posix()
    return "?"


def _find_inputs(root: Path, assumptions: list[str], synthesise: bool = False) -> tuple[str | None, str | None]:
    """A sample-inputs function (and decode) in the model's files, by conventional names; the
    ``npuport_inputs.py`` hook first. None: the harness synthesises inputs from the method's signature."""
    files = _python_files(root)
    files.sort(key=lambda p: p.name != INPUTS_HOOK)
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        fns = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        for fn in INPUT_FN_NAMES:
            if fn in fns:
                module = path.relative_to(root).as_posix().removesuffix(".py").replace("/", ".")
                decode = f"{module}:decode" if "decode" in fns else None
                assumptions.append(f"sample inputs from {module}:{fn}(config, seed)")
                return f"{module}:{fn}", decode
    if synthesise:
        assumptions.append(f"no sample-inputs function ({', '.join(INPUT_FN_NAMES)}) and no {INPUTS_HOOK}: inputs "
                           "come from the model's own preprocessing path when it has one, else are synthesised "
                           "from the run method's signature and the config (token ids within the vocabulary, "
                           "images of the config's image size)")
    else:
        assumptions.append(f"no sample-inputs function ({', '.join(INPUT_FN_NAMES)}) found: inputs must be given "
                           f"in an {MANIFEST_NAME}")
    return None, None
