"""Inputs for a model that ships no inputs function: from its own preprocessing path when it has one,
else synthesised from its run method's signature and config.

The model's preprocessing path is an infer-style method that takes a tokenizer (``infer(tokenizer,
prompt, image_file, ...)``): it tokenises a prompt, loads and transforms an image, builds whatever
structures the model wants (image lists, tile grids, masks of the positions image features fill) and
calls ``generate``. npuport calls that method with a test prompt and a test image and intercepts the
``generate`` call: its arguments are the inputs, built by the model's own code, so their shapes are
the model's and not guessed from argument names. The tokenizer is the folder's own (tokenizer.json,
...) when present, else a stand-in: deterministic character ids within the vocabulary that avoid the
special ids, with the special tokens of tokenizer_config.json.

Also the weight seeding both use (seed_parameters). Self-contained (torch, and transformers / Pillow when a
preprocessing path is driven): it runs in the sandbox harness and ships in the bundle as ``model_inputs.py``
for run.py, so the two cannot drift apart. It imports nothing of npuport.
"""

from __future__ import annotations

import ast
import inspect
import re
import tempfile
import textwrap
from pathlib import Path
from typing import Any, get_args

if __package__:  # inside npuport (sandbox.inputs.model_inputs)
    from .generate_capture import _GenerateCalled, call_until_generate, generate_arguments, owner_path  # noqa: F401
    from .inputs_base import (  # noqa: F401  (re-exported: the names this module always offered)
        DECODING_CONTROLS,
        PROCESSOR_FILES,
        PROCESSOR_PATH,
        SYNTH_TOKENS,
        TEST_PROMPT,
        TOKENIZER_FILES,
        PreprocessingFailed,
        cast_floats,
        embedding_rows,
        length_arguments,
        model_float_dtype,
        nested_int,
        present_run_method,
        shape_text,
        test_image,
        with_embedding_rows,
        with_folder_token_ids,
    )
    from .processor_inputs import processor_inputs
    from .stand_in_tokenizer import has_tokenizer_files, load_tokenizer, stand_in_tokenizer  # noqa: F401
    from .tower_inputs import synthesised_towers, tower_params
else:  # beside a bundle's run.py, with its sibling modules
    from generate_capture import (  # type: ignore[no-redef]  # noqa: F401
        _GenerateCalled,
        call_until_generate,
        generate_arguments,
        owner_path,
    )
    from inputs_base import (  # type: ignore[no-redef]  # noqa: F401
        DECODING_CONTROLS,
        PROCESSOR_FILES,
        PROCESSOR_PATH,
        SYNTH_TOKENS,
        TEST_PROMPT,
        TOKENIZER_FILES,
        PreprocessingFailed,
        cast_floats,
        embedding_rows,
        length_arguments,
        model_float_dtype,
        nested_int,
        present_run_method,
        shape_text,
        test_image,
        with_embedding_rows,
        with_folder_token_ids,
    )
    from processor_inputs import processor_inputs  # type: ignore[no-redef]
    from stand_in_tokenizer import has_tokenizer_files, load_tokenizer, stand_in_tokenizer  # type: ignore[no-redef]  # noqa: F401
    from tower_inputs import synthesised_towers, tower_params  # type: ignore[no-redef]

_IMAGE_PARAM = re.compile(r"^(image|img|picture|photo)s?(_file|_path|_files|_paths)?$", re.IGNORECASE)
_PROMPT_PARAM = re.compile(r"^(prompt|query|question|text|instruction|message)s?$", re.IGNORECASE)
_OUTPUT_PARAM = re.compile(r"^(output|out|save|result)s?(_path|_dir|_folder)?$", re.IGNORECASE)
_HISTORY_PARAM = re.compile(r"^(history|histories|messages|conversation)$", re.IGNORECASE)
_GENERATION_PARAM = re.compile(r"^(generation_config|gen_config|generation_kwargs|gen_kwargs)$", re.IGNORECASE)
_OPTIONAL_TEXT = re.compile(r"^(typing\.)?Optional\[|\|\s*None\b|\bNone\s*\|")  # an annotation kept as text
_PLACEHOLDER = re.compile(r"<[^<>\s]*image[^<>\s]*>", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------
# Weights (random, per parameter name, so the original and the port get the same)
# ----------------------------------------------------------------------------------------------

class marked_uninitialised:  # noqa: N801 - used as a context manager, like torch's own
    """Build the model inside this: memory the constructor leaves uninitialised (``torch.empty`` that no
    ``_init_weights`` touches) is filled with NaN (integers: their max), not whatever memory held, so
    seed_parameters can tell it apart and seed it (torch's fill_uninitialized_memory, torch >= 2.1)."""

    def __enter__(self) -> None:
        import torch

        self._det = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=True)  # warn-only: no op may refuse to run

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.use_deterministic_algorithms(self._det[0], warn_only=self._det[1])


def materialise_meta(model: Any) -> list[str]:
    """Parameters and buffers the model's code leaves on the meta device (built under
    ``init_empty_weights`` for a checkpoint to fill) get CPU memory, NaN-filled so seed_parameters seeds
    them like any weight the model never initialised; the names of the modules that held them."""
    import torch

    held: dict[str, int] = {}
    for mod_name, module in model.named_modules():
        for table in (module._parameters, module._buffers):
            for key, t in list(table.items()):
                if not isinstance(t, torch.Tensor) or not t.is_meta:
                    continue
                real = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                real.fill_(float("nan") if real.is_floating_point() else 0)
                table[key] = torch.nn.Parameter(real, requires_grad=t.requires_grad) \
                    if isinstance(t, torch.nn.Parameter) else real
                top = mod_name.split(".")[0] or "(root)"
                held[top] = held.get(top, 0) + 1
    return [f"{m}: {n} tensor(s)" for m, n in held.items()]


STAT_SAMPLE = 1 << 22  # elements a parameter's mean and spread are read from (a 4096x4096 weight: all of them)


def stat_sample(p: Any) -> Any:
    """The parameter's values its mean and spread are read from, in float32: all of them up to STAT_SAMPLE,
    else an even stride through them. A model kept wide by hard-coded sizes holds ~2e9 values; reading each
    twice (finite check, std_mean) before seeding cost a minute on two cores, and the stride's statistics
    differ from the whole tensor's by ~1e-3 of the spread. An uninitialised (all-NaN) tensor shows in any
    sample."""
    flat = p.detach().reshape(-1)
    step = max(1, flat.numel() // STAT_SAMPLE)
    return flat[::step].float()


def seed_parameters(model: Any, seed: int) -> list[str]:
    """Give every parameter values that depend only on its name and the seed, so the original and the
    port (whose module construction order may differ) get the same weights. Each parameter keeps the
    mean and spread of the model's own initialisation (gains, ones for norm scales, zero biases); one the
    model never initialised (NaN under marked_uninitialised, or non-finite) gets normal(0, the config's
    initializer_range). Buffers keep their values (masks, rotary tables) unless uninitialised too. Tensors left
    on the meta device are materialised first (materialise_meta); returns what was."""
    import zlib

    import torch

    init_std = float(getattr(getattr(model, "config", None), "initializer_range", 0.02) or 0.02)
    materialised = materialise_meta(model)

    def gen(name: str) -> Any:
        return torch.Generator().manual_seed((zlib.crc32(name.encode()) + seed) % (2**31))

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point() or not p.numel():
                continue
            sample = stat_sample(p)
            if not bool(torch.isfinite(sample).all()):
                p.normal_(0.0, init_std, generator=gen(name))
                continue
            if sample.numel() > 1:
                std_t, mean_t = torch.std_mean(sample)
                mean, std = float(mean_t), float(std_t)
            else:
                mean, std = float(sample.mean()), 0.0
            # In place, one pass: a shrunk model with a hard-coded vision tower still holds ~1e9 values.
            p.normal_(mean, std, generator=gen(name)) if std > 0 else p.fill_(mean)
        for name, b in model.named_buffers():
            if not isinstance(b, torch.Tensor) or not b.numel() or b.is_meta:
                continue
            inexact = b.is_floating_point() or b.is_complex()  # complex: rotary tables such as freqs_cis
            if inexact and bool(torch.isnan(b).all()):
                b.normal_(0.0, init_std, generator=gen(name))
            elif not inexact and b.dtype != torch.bool and bool((b == torch.iinfo(b.dtype).max).all()):
                b.zero_()
    return materialised


# ----------------------------------------------------------------------------------------------
# Synthesised inputs (no preprocessing path)
# ----------------------------------------------------------------------------------------------

# A generate whose first parameter is one of these takes text, not token ids (``generate(self, text, image)``)
TEXT_PARAMS = ("text", "texts", "prompt", "prompts", "query", "question", "instruction", "message")


def takes_text(fn: Any) -> bool:
    """The method's first parameter is a prompt (text), not token ids or embeddings."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].name in TEXT_PARAMS


def language_model_path(model: Any) -> str | None:
    """The dotted name of the shallowest submodule that generates from token ids (a transformers generate
    whose first parameter is not text, and input embeddings): the language model a wrapper whose own
    generate takes text generates through."""
    named = getattr(model, "named_modules", None)
    found = [(name, m) for name, m in (named() if callable(named) else []) if name and m is not model
             and callable(getattr(m, "generate", None)) and callable(getattr(m, "get_input_embeddings", None))
             and not takes_text(m.generate) and _generates_from_ids(m)]
    # the shallowest; among those the largest (a Q-Former beside the language model generates too)
    found.sort(key=lambda nm: (nm[0].count("."), -sum(p.numel() for p in nm[1].parameters())))
    return found[0][0] if found else None


def text_wrapper_language_model(model: Any, method: str) -> str | None:
    """The language model to run when the model's own ``generate`` takes text (``generate(text, image)``) and
    its preprocessing path could not give token inputs; None for any other model or method."""
    if method != "generate" or not takes_text(getattr(model, "generate", None)):
        return None
    return language_model_path(model)


def _generates_from_ids(module: Any) -> bool:
    """Its prepare_inputs_for_generation needs nothing but the ids (a Q-Former's asks for query_embeds)."""
    prepare = getattr(module, "prepare_inputs_for_generation", None)
    if prepare is None:
        return True
    try:
        params = list(inspect.signature(prepare).parameters.values())
    except (TypeError, ValueError):
        return True
    required = [p for p in params[1:]
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return not required


def builds_own_mask(model: Any, method_name: str) -> bool:
    """The model's own ``generate`` (its code, not transformers') names its token or image inputs but no
    attention mask: it builds the mask itself (image features merged into the text embeddings make it longer
    than the ids), and a mask of the ids' length passed through its ``**kwargs`` would not fit. A batch of one
    unpadded prompt means the same without one."""
    if method_name != "generate":
        return False
    fn = getattr(type(model), "generate", None)
    if fn is None or (getattr(fn, "__module__", "") or "").startswith(("transformers.", "torch.")):
        return False
    try:
        params = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return "attention_mask" not in params and bool(params & {"input_ids", "pixel_values", "images", "image"})


def _signature_names(model: Any, method_name: str) -> tuple[set[str], bool]:
    """The parameter names of the run method and forward, and whether either takes **kwargs."""
    names: set[str] = set()
    var_kw = False
    for name in dict.fromkeys((method_name, "forward")):
        fn = getattr(model, name, None)
        if fn is None:
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        names |= set(params)
        var_kw = var_kw or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return names, var_kw


PIXEL_NAMES = ("pixel_values", "images", "image")


def pixel_grid_names(model: Any, method_name: str) -> list[str]:
    """The grid parameters that come with the pixels (``grid_thws``, ``image_grid_thw``): the model takes its
    images as packed patches with each image's (t, h, w), a structure npuport does not guess, so synthesised
    inputs leave the pixels out and run the text alone. Empty when the method takes no such grid."""
    return _grid_names(_signature_names(model, method_name)[0])


def _grid_names(names: set[str]) -> list[str]:
    pixels = any(kind == "pixels" for kind in tower_params(names).values())
    return sorted(n for n in names if "grid" in n.lower()) if pixels else []


def synthesised_tower_data(names: set[str], config: dict[str, Any], generator: Any) -> dict[str, Any]:
    """Pixels, audio features or a waveform for each tower the run method takes (sandbox/inputs/tower_inputs.py),
    of the config's sizes; pixels that come with a grid are left out (pixel_grid_names)."""
    grids = _grid_names(names)
    skip = {n for n, kind in tower_params(names).items() if kind == "pixels"} if grids else set()
    return synthesised_towers(names, config, generator, skip)[0]


# Parameters a run method takes that steer the call rather than carry the input
_NOT_INPUTS = frozenset({"self", "attention_mask", "position_ids", "past_key_values", "use_cache", "labels",
                         "return_dict", "output_attentions", "output_hidden_states", "cache_position", "inputs_embeds",
                         "token_type_ids", "head_mask", "logits_to_keep", "num_logits_to_keep", "inputs",
                         "prefix_allowed_tokens_fn", "negative_prompt_ids", "negative_prompt_attention_mask",
                         "use_model_defaults", "custom_generate", "tokenizer", "return_loss"})


def unfed_parameters(model: Any, method_name: str, fed: set[str]) -> list[str]:
    """The run method's own parameters that synthesised inputs leave out (``glyphs``: a name that says nothing
    npuport reads as ids or a tower's data): what a run on them does not exercise."""
    try:
        params = inspect.signature(getattr(model, method_name)).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in fed
            and p.name not in _NOT_INPUTS and p.name not in DECODING_CONTROLS]


def synthesised_tower_notes(model: Any, method_name: str, config: dict[str, Any]) -> list[str]:
    """What synthesise_inputs fed each tower, for the report (the same sizes, no tensors made)."""
    import torch

    names = _signature_names(model, method_name)[0]
    skip = {n for n, kind in tower_params(names).items() if kind == "pixels"} if _grid_names(names) else set()
    with torch.device("meta"):
        return synthesised_towers(names, config, None, skip)[1]


def synthesise_inputs(model: Any, method_name: str, config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Token ids within the vocabulary (and a mask) for a method that takes them, and data of the config's
    sizes for each tower it takes (pixels, audio features, a waveform: sandbox/inputs/tower_inputs.py). Structured
    inputs (image lists, grids, masks) are not guessed: they come from the model's preprocessing path or an
    npuport_inputs.py hook; pixels that come with a grid are left out (pixel_grid_names)."""
    import torch

    names, var_kw = _signature_names(model, method_name)
    g = torch.Generator().manual_seed(seed)
    vocab = nested_int(config, "vocab_size") or embedding_rows(model) or 256
    out: dict[str, Any] = {}
    if "input_ids" in names or var_kw:
        out["input_ids"] = torch.randint(0, vocab, (1, SYNTH_TOKENS), generator=g)
        if "attention_mask" in names and not builds_own_mask(model, method_name):
            out["attention_mask"] = torch.ones(1, SYNTH_TOKENS, dtype=torch.long)
    out.update(synthesised_tower_data(names, config, g))
    if not out:
        raise ValueError(f"no inputs function and none can be synthesised for {method_name}: add an "
                         "npuport_inputs.py with make_inputs(config, seed) (docs/architecture.md, Model manifest)")
    return out


# ----------------------------------------------------------------------------------------------
# The model's own preprocessing path
# ----------------------------------------------------------------------------------------------

def preprocessing_method(model: Any, name: str) -> Any:
    fn = getattr(model, name, None)
    if fn is None or not callable(fn):
        raise PreprocessingFailed(f"the model has no method {name}")
    return fn


def _placeholder(fn: Any) -> str | None:
    """The image placeholder the method's own code uses ('<image>'), from its string constants."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = _PLACEHOLDER.search(node.value)
            if found:
                return found.group(0)
    return None


def reads_own_tokenizer(fn: Any) -> bool:
    """The method works through ``self.tokenizer`` (an attribute the user sets: ``model.tokenizer = tok``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Attribute) and n.attr == "tokenizer" and isinstance(n.value, ast.Name)
               and n.value.id == "self" for n in ast.walk(tree))


def preprocessing_arguments(fn: Any, tokenizer: Any, config: dict[str, Any], seed: int, workdir: Path,
                            max_new_tokens: int) -> dict[str, Any]:
    """Arguments for an infer-style method: the tokenizer (unless it reads ``self.tokenizer``), a test prompt
    (with the method's image placeholder when it takes an image), a test image, a scratch output folder;
    defaults elsewhere."""
    params = inspect.signature(fn).parameters
    if "tokenizer" not in params and not reads_own_tokenizer(fn):
        raise PreprocessingFailed(f"{fn.__name__} takes no tokenizer")
    args: dict[str, Any] = {"tokenizer": tokenizer} if "tokenizer" in params else {}
    image_param = next((n for n in params if _IMAGE_PARAM.match(n)), None)
    # a required tensor a tower takes (``chat(tokenizer, pixel_values, question, ...)``): data of the config's sizes
    towers = {n: k for n, k in tower_params(list(params)).items() if params[n].default is params[n].empty}
    for name, p in params.items():
        if name == "tokenizer" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name == image_param:
            image = test_image(config, seed, workdir / f"npuport-test-image-{seed}.png")
            if name.endswith("s") or name.endswith(("_files", "_paths")):
                args[name] = [str(image)]
            else:
                args[name] = str(image)
        elif _PROMPT_PARAM.match(name):
            mark = _placeholder(fn) if image_param else None
            args[name] = f"{mark}\n{TEST_PROMPT}" if mark else TEST_PROMPT
        elif _OUTPUT_PARAM.match(name):
            out = workdir / "output"
            out.mkdir(exist_ok=True)
            args[name] = str(out)
        elif name == "max_new_tokens":
            args[name] = max_new_tokens
        elif _HISTORY_PARAM.match(name) and p.default is p.empty:
            args[name] = []  # the conversation so far: none (as own_inputs.builder_arguments gives)
        elif _HISTORY_PARAM.match(name):
            continue  # its default: a chat may build its first turn only for history=None (the image tag)
        elif name in towers and name != image_param:
            import torch

            args[name] = synthesised_towers([name], config, torch.Generator().manual_seed(seed))[0][name]
        elif _GENERATION_PARAM.match(name) and p.default is p.empty:
            args[name] = {"max_new_tokens": max_new_tokens, "do_sample": False}  # greedy, as every run
        elif p.default is p.empty and _takes_none(p):
            args[name] = None  # required but typed Optional: the method itself says it handles None
        elif p.default is p.empty:
            raise PreprocessingFailed(f"{fn.__name__} needs {name!r}, which npuport cannot supply")
    return args


def _takes_none(p: inspect.Parameter) -> bool:
    """Whether a parameter's annotation admits None (``Optional[X]``, ``X | None``, as an object or as text)."""
    if p.annotation is p.empty:
        return False
    if isinstance(p.annotation, str):
        return bool(_OPTIONAL_TEXT.search(p.annotation))
    return type(None) in get_args(p.annotation)


class Captured:
    """What the model's preprocessing path handed to generate: the inputs (tensors, by name), the other
    arguments kept, the notes for the report, and ``method``: the dotted path of the generate that was
    called when it is a submodule's (the model generates through its language model), else None."""

    def __init__(self, inputs: dict[str, Any], kwargs: dict[str, Any], notes: list[str], method: str | None = None):
        self.inputs, self.kwargs, self.notes, self.method = inputs, kwargs, notes, method


def capture_preprocessed_inputs(model: Any, method_name: str, model_dir: Path, config: dict[str, Any], seed: int,
                                max_new_tokens: int = 8) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """capture_preprocessed() as (inputs, kwargs, notes)."""
    got = capture_preprocessed(model, method_name, model_dir, config, seed, max_new_tokens)
    return got.inputs, got.kwargs, got.notes


def capture_preprocessed(model: Any, method_name: str, model_dir: Path, config: dict[str, Any], seed: int,
                         max_new_tokens: int = 8) -> Captured:
    """Call the model's preprocessing method and stop it at its generate call.

    Returns the tensor arguments generate got, by name; the other arguments, decoding controls removed; what
    was done, for the report; and the generate's path when it was a submodule's. Floating tensors are cast to
    the model's dtype: an infer method typically casts images for an autocast region npuport does not
    reproduce. A method that reads ``self.tokenizer`` (an attribute the authors set, ``model.tokenizer =
    tokenizer``) gets the tokenizer that way."""
    if method_name == PROCESSOR_PATH:
        return Captured(*processor_inputs(model, model_dir, config, seed, max_new_tokens))
    fn = preprocessing_method(model, method_name)
    tokenizer, how = load_tokenizer(model_dir, with_embedding_rows(model, config))
    as_attribute = "tokenizer" not in inspect.signature(fn).parameters and reads_own_tokenizer(fn)
    if as_attribute:
        model.tokenizer = tokenizer
    # the test image and the method's output folder live only for the call: the captured tensors are in memory
    with tempfile.TemporaryDirectory(prefix="npuport-preprocess-") as tmp:
        call = preprocessing_arguments(fn, tokenizer, config, seed, Path(tmp), max_new_tokens)
        captured = call_until_generate(model, lambda: fn(**call), f"{method_name}()")
    path = owner_path(model, captured.owner)
    owner = model.get_submodule(path) if path else model
    target = getattr(owner, "generate", None) or owner.forward
    inputs, kwargs = generate_arguments(model, target, captured, f"{method_name}()")
    dtype = model_float_dtype(model)
    shapes = ", ".join(f"{k} {shape_text(v)}" for k, v in inputs.items())
    where = f"{path}.generate" if path else "generate"
    notes = [f"inputs built by the model's own preprocessing path {type(model).__name__}.{method_name}() with "
             f"{how}{' (set as model.tokenizer, which the method reads)' if as_attribute else ''}, a test prompt and "
             f"a test image; its {where} call was intercepted: {shapes}"]
    if path:
        notes.append(f"the model generates through its submodule {path} ({type(owner).__name__}): the run calls "
                     f"{where} with these inputs (the image and the text were encoded by the model's own code)")
    if kwargs:
        notes.append("the preprocessing path's generate arguments kept: "
                     + ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items())))
    if dtype is not None:
        notes.append(f"floating inputs cast to the model's dtype ({str(dtype).removeprefix('torch.')})")
    return Captured(inputs, kwargs, notes, f"{path}.generate" if path else None)
