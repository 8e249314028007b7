"""How a model with no manifest is run (agents/entry.py): the method to call (generate for a generative
model, forward for an encoder, whose forward outputs are then what validation compares), where its
inputs come from (an inputs function, its own preprocessing path, its processor, else synthesised) and
what was assumed, written down for the report."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from agents.reading.entry_source import (
    MANIFEST_NAME,
    _base_name,
    _local_hierarchy,
    _python_files,
)
from sandbox.inputs.model_inputs import PROCESSOR_FILES, PROCESSOR_PATH, TOKENIZER_FILES

INPUT_FN_NAMES = ("make_inputs", "sample_inputs", "get_inputs", "example_inputs")
# auto_map keys under which the authors load the class as a generator: transformers' generate (its default
# prepare_inputs_for_generation) is how it runs, even when the class defines no generation hook itself.
GENERATIVE_AUTO_KEYS = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForVision2Seq",
                        "AutoModelForImageTextToText")
# Methods whose presence says the class generates (transformers' generate calls the second).
GENERATION_HOOKS = ("generate", "prepare_inputs_for_generation")
FORWARD_OUTPUTS_NOTE = ("validated on its forward outputs (hidden states / logits / embeddings, each compared with "
                        "the original's within the port dtype's tolerance), not on greedy tokens")


def _run_method(tree: ast.Module, cls: str, assumptions: list[str],
                classes: dict[str, ast.ClassDef] | None = None, auto_key: str | None = None) -> str:
    """``generate`` for a class that generates: it (or a local base) defines generate or
    prepare_inputs_for_generation, or derives from GenerationMixin, or is a PreTrainedModel its config loads
    as a generator (AutoModelForCausalLM, ...). Otherwise ``forward``: an encoder (AutoModel,
    AutoModelForMaskedLM, ...) has no LM head to generate with, and transformers' generate refuses it."""
    classes = classes or {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    pretrained = ""
    for name, node in _local_hierarchy(classes, cls):
        hooks = [b.name for b in node.body if isinstance(b, ast.FunctionDef) and b.name in GENERATION_HOOKS]
        if "generate" in hooks:
            return "generate"
        bases = [_base_name(b) for b in node.bases]
        mixin = next((b for b in bases if b.endswith("GenerationMixin") and b.rsplit(".", 1)[-1] not in classes), "")
        pretrained = pretrained or next((b for b in bases if b.endswith("PreTrainedModel")
                                         and b.rsplit(".", 1)[-1] not in classes), "")
        if hooks or mixin:
            why = f"defines {hooks[0]} in {name}" if hooks else f"derives from {mixin}"
            assumptions.append(f"{cls} inherits generate from transformers "
                               f"({mixin or pretrained or 'GenerationMixin'}; it {why}); HF generate returns the "
                               "prompt and the new tokens")
            return "generate"
    if pretrained and auto_key in GENERATIVE_AUTO_KEYS:
        assumptions.append(f"{cls} inherits generate from transformers ({pretrained}; config.json loads it as "
                           f"{auto_key}); HF generate returns the prompt and the new tokens")
        return "generate"
    loaded = f", and config.json loads it as {auto_key}" if auto_key else ""
    assumptions.append(f"{cls} has no generate and no prepare_inputs_for_generation{loaded}: it runs forward and is "
                       + FORWARD_OUTPUTS_NOTE)
    return "forward"


INPUTS_HOOK = "npuport_inputs.py"  # the documented inputs hook, looked at first
PREPROCESS_METHODS = ("infer", "chat", "preprocess", "process_inputs", "prepare_inputs")


PROMPT_PARAMS = ("text", "prompt", "query", "question", "instruction", "message")


def _reads_self_tokenizer(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "tokenizer" and isinstance(n.value, ast.Name)
               and n.value.id == "self" for n in ast.walk(fn))


def _preprocessing_candidates(classes: dict[str, ast.ClassDef], cls: str) -> Iterator[
        tuple[str, ast.ClassDef, ast.FunctionDef | None, str]]:
    """(class, node, method, how it gets the tokenizer): an infer-style method taking a tokenizer, first in
    each class nearest first; then one (infer-style, or the class's own generate) that takes a prompt and
    works through ``self.tokenizer``, an attribute the authors set (``model.tokenizer = tokenizer``)."""
    hierarchy = list(_local_hierarchy(classes, cls))
    for name, node in hierarchy:
        for fn in node.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in PREPROCESS_METHODS and \
                    any(a.arg == "tokenizer" for a in fn.args.args):
                yield name, node, fn, "tokenizer, "
    for wanted in (*PREPROCESS_METHODS, "generate"):
        for name, node in hierarchy:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == wanted and _reads_self_tokenizer(fn) and \
                        any(a.arg in PROMPT_PARAMS for a in fn.args.args):
                    yield name, node, fn, "the prompt; model.tokenizer set, which it reads; "


def _preprocessing_method(root: Path, cls: str, classes: dict[str, ast.ClassDef],
                          assumptions: list[str]) -> str | None:
    """The model's own preprocessing path: an infer-style method of the class (or a local base) that
    takes a tokenizer, else the folder's processor (AutoProcessor) when its files are there. The harness
    drives it for the inputs (sandbox/inputs/model_inputs.py)."""
    for name, node, fn, how in _preprocessing_candidates(classes, cls):
        if fn is not None:
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
                assumptions.append(f"inputs come from the model's own preprocessing path {name}.{fn.name}({how}"
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
    if have_processor and (root / "tokenizer_config.json").is_file():
        assumptions.append(f"inputs come from the folder's own processor ({', '.join(have_processor)}) on a "
                           f"test prompt and a test image; its tokenizer files ({', '.join(TOKENIZER_FILES)}) are "
                           "not in the folder, so unless AutoProcessor loads it, the processor gets a stand-in "
                           "tokenizer (character ids, the special tokens of tokenizer_config.json / "
                           "added_tokens.json with their ids) (docs/architecture.md, Inputs when the model has none)")
        return PROCESSOR_PATH
    if have_processor:
        assumptions.append(f"the folder has a processor config ({', '.join(have_processor)}) but no tokenizer "
                           f"({', '.join(TOKENIZER_FILES)} or tokenizer_config.json), so its processor cannot be "
                           "loaded; inputs are synthesised")
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
