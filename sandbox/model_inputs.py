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
import json
import re
import tempfile
import textwrap
from pathlib import Path
from typing import Any

SYNTH_TOKENS = 8  # prompt length of synthesised inputs
TEST_PROMPT = "Read the text in the image."
TEST_IMAGE_MAX_SIDE = 448  # small, so tiling code stays in its single-view branch on a 2-core box
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
PROCESSOR_PATH = "AutoProcessor"  # run.preprocess value: the folder's processor, not a method of the model
# generate() arguments that steer decoding rather than describe the input: npuport's run kwargs decide
# these (greedy, N new tokens), and a streamer would print every token.
DECODING_CONTROLS = frozenset({"streamer", "max_new_tokens", "max_length", "min_new_tokens", "min_length",
                               "do_sample", "temperature", "top_p", "top_k", "num_beams", "generation_config",
                               "logits_processor", "stopping_criteria", "synced_gpus", "assistant_model"})
_IMAGE_PARAM = re.compile(r"^(image|img|picture|photo)s?(_file|_path|_files|_paths)?$", re.IGNORECASE)
_PROMPT_PARAM = re.compile(r"^(prompt|query|question|text|instruction|message)s?$", re.IGNORECASE)
_OUTPUT_PARAM = re.compile(r"^(output|out|save|result)s?(_path|_dir|_folder)?$", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"<[^<>\s]*image[^<>\s]*>", re.IGNORECASE)


def nested(config: dict[str, Any], key: str) -> Any:
    """config[key], else the first value under that key in a nested sub-config."""
    if config.get(key) is not None:
        return config[key]
    for v in config.values():
        if isinstance(v, dict):
            found = nested(v, key)
            if found is not None:
                return found
    return None


# ----------------------------------------------------------------------------------------------
# Weights (random, per parameter name, so the original and the port get the same)
# ----------------------------------------------------------------------------------------------

class marked_uninitialised:  # noqa: N801 - used as a context manager, like torch's own
    """Build the model inside this: memory the constructor leaves uninitialised (``torch.empty`` that no
    ``_init_weights`` touches) is filled with NaN (integers: their max), not whatever memory held, so
    seed_parameters can tell it apart and seed it (torch's fill_uninitialized_memory, torch >= 2.1)."""

    def __enter__(self) -> None:
        import torch

        self._det = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=True)  # warn-only: no op may refuse to run

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.use_deterministic_algorithms(self._det[0], warn_only=self._det[1])


def seed_parameters(model: Any, seed: int) -> None:
    """Give every parameter values that depend only on its name and the seed, so the original and the
    port (whose module construction order may differ) get the same weights. Each parameter keeps the
    mean and spread of the model's own initialisation (gains, ones for norm scales, zero biases); one the
    model never initialised (NaN under marked_uninitialised, or non-finite) gets normal(0, the config's
    initializer_range). Buffers keep their values (masks, rotary tables) unless uninitialised too."""
    import zlib

    import torch

    init_std = float(getattr(getattr(model, "config", None), "initializer_range", 0.02) or 0.02)

    def gen(name: str) -> Any:
        return torch.Generator().manual_seed((zlib.crc32(name.encode()) + seed) % (2**31))

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point() or not p.numel():
                continue
            if not bool(torch.isfinite(p).all()):
                p.normal_(0.0, init_std, generator=gen(name))
                continue
            if p.numel() > 1:
                std_t, mean_t = torch.std_mean(p.detach().float())
                mean, std = float(mean_t), float(std_t)
            else:
                mean, std = float(p.detach().float().mean()), 0.0
            # In place, one pass: a shrunk model with a hard-coded vision tower still holds ~1e9 values.
            p.normal_(mean, std, generator=gen(name)) if std > 0 else p.fill_(mean)
        for name, b in model.named_buffers():
            if not isinstance(b, torch.Tensor) or not b.numel() or b.is_meta:
                continue
            if b.is_floating_point() and bool(torch.isnan(b).all()):
                b.normal_(0.0, init_std, generator=gen(name))
            elif not b.is_floating_point() and b.dtype != torch.bool and bool((b == torch.iinfo(b.dtype).max).all()):
                b.zero_()


# ----------------------------------------------------------------------------------------------
# Synthesised inputs (no preprocessing path)
# ----------------------------------------------------------------------------------------------

def synthesise_inputs(model: Any, method_name: str, config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Token ids within the vocabulary (and a mask) for a method that takes them, an image batch of the
    config's image size for one that names pixels. Structured inputs (image lists, grids, masks) are not
    guessed: they come from the model's preprocessing path or an npuport_inputs.py hook."""
    import torch

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
    g = torch.Generator().manual_seed(seed)
    vocab = nested(config, "vocab_size") or 256
    out: dict[str, Any] = {}
    if "input_ids" in names or var_kw:
        out["input_ids"] = torch.randint(0, int(vocab), (1, SYNTH_TOKENS), generator=g)
        if "attention_mask" in names:
            out["attention_mask"] = torch.ones(1, SYNTH_TOKENS, dtype=torch.long)
    size = int(nested(config, "image_size") or 32)
    chans = int(nested(config, "num_channels") or 3)
    for pix in ("pixel_values", "images", "image"):
        if pix in names:
            out[pix] = torch.randn(1, chans, size, size, generator=g)
            break
    if not out:
        raise ValueError(f"no inputs function and none can be synthesised for {method_name}: add an "
                         "npuport_inputs.py with make_inputs(config, seed) (docs/architecture.md, Model manifest)")
    return out


# ----------------------------------------------------------------------------------------------
# The model's own preprocessing path
# ----------------------------------------------------------------------------------------------

try:  # inside npuport, one of its errors; beside a bundle's run.py (no npuport there), a plain one
    from knowledge.errors import NpuportError as _ErrorBase
except ImportError:  # pragma: no cover - exercised by the bundle's run.py
    _ErrorBase = Exception  # type: ignore[misc,assignment]


class PreprocessingFailed(_ErrorBase, RuntimeError):
    """The preprocessing path could not be driven; the message says why (the harness falls back)."""


class _GenerateCalled(Exception):  # noqa: N818  (a signal, not an error)
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("generate called")
        self.call_args = args
        self.call_kwargs = kwargs


def has_tokenizer_files(model_dir: Path) -> list[str]:
    return [f for f in TOKENIZER_FILES if (Path(model_dir) / f).is_file()]


_TOKENIZERS: dict[tuple[str, int], tuple[Any, str]] = {}  # one per model folder and vocabulary: built once


def load_tokenizer(model_dir: Path, config: dict[str, Any]) -> tuple[Any, str]:
    """The folder's tokenizer through AutoTokenizer when it has tokenizer files, else a stand-in."""
    key = (str(model_dir), int(nested(config, "vocab_size") or 0))
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _load_tokenizer(model_dir, config)
    return _TOKENIZERS[key]


def _load_tokenizer(model_dir: Path, config: dict[str, Any]) -> tuple[Any, str]:
    """AutoTokenizer over the folder when it holds tokenizer files or a tokenizer_config.json (a custom
    tokenizer class through auto_map with its own vocabulary file loads this way too); a stand-in when
    there is none or it does not load here, with the reason."""
    have = has_tokenizer_files(model_dir)
    why = f"no {', '.join(TOKENIZER_FILES)} or tokenizer_config.json in the folder"
    if have or (Path(model_dir) / "tokenizer_config.json").is_file():
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True, local_files_only=True)
            return tok, f"the folder's tokenizer ({', '.join(have) or 'tokenizer_config.json'}, {type(tok).__name__})"
        except Exception as exc:  # a missing vocabulary file, a tokenizer class this transformers lacks, ...
            first = str(exc).splitlines()[0][:160] if str(exc) else ""
            why = f"the folder's tokenizer does not load here ({type(exc).__name__}: {first})"
    return stand_in_tokenizer(model_dir, config), (
        f"a stand-in tokenizer ({why}): character ids within the vocabulary, the special tokens of "
        "tokenizer_config.json; the text differs from the real tokenizer's, the structure built around it is "
        "the model's own")


def _special_tokens(model_dir: Path) -> tuple[dict[str, int], dict[str, str]]:
    """(content -> id of every added token, role -> content of bos/eos/pad/unk) from tokenizer_config.json."""
    path = Path(model_dir) / "tokenizer_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        cfg = {}
    ids: dict[str, int] = {}
    for key, tok in (cfg.get("added_tokens_decoder") or {}).items():
        content = tok.get("content") if isinstance(tok, dict) else None
        if isinstance(content, str) and str(key).isdigit():
            ids[content] = int(key)
    roles: dict[str, str] = {}
    for role in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = cfg.get(role)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            roles[role] = v
    return ids, roles


def stand_in_tokenizer(model_dir: Path, config: dict[str, Any]) -> Any:
    """A transformers PreTrainedTokenizer whose ids are deterministic per character (encode, decode,
    __call__, the special-token ids all work as a real tokenizer's do)."""
    from transformers import PreTrainedTokenizer

    vocab_size = int(nested(config, "vocab_size") or 256)
    added, roles = _special_tokens(model_dir)
    added = {t: i for t, i in added.items() if i < vocab_size}
    for role, default_id in (("bos_token", config.get("bos_token_id")), ("eos_token", config.get("eos_token_id"))):
        if role not in roles and isinstance(default_id, int) and default_id < vocab_size:
            roles[role] = f"<npuport_{role}>"
            added[roles[role]] = default_id
    taken = set(added.values())
    free = [i for i in range(vocab_size) if i not in taken][:4096]
    if not free:
        raise PreprocessingFailed("the vocabulary has no ids left for a stand-in tokenizer")

    class StandInTokenizer(PreTrainedTokenizer):  # type: ignore[misc,valid-type]
        model_input_names = ["input_ids", "attention_mask"]

        def __init__(self, **kwargs: Any) -> None:
            self._fixed = dict(added)
            self._by_id = {i: t for t, i in added.items()}
            super().__init__(**{r: t for r, t in roles.items() if t in added}, **kwargs)

        @property
        def vocab_size(self) -> int:
            return vocab_size

        def get_vocab(self) -> dict[str, int]:
            return dict(self._fixed)

        def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
            return list(text)

        def _convert_token_to_id(self, token: str) -> int:
            if token in self._fixed:
                return self._fixed[token]
            return free[sum(ord(c) for c in token) % len(free)]

        def _convert_id_to_token(self, index: int) -> str:
            if index in self._by_id:
                return self._by_id[index]
            pos = free.index(index) if index in free else -1
            return chr(pos) if pos >= 0 else f"<{index}>"

        def convert_tokens_to_string(self, tokens: list[str]) -> str:
            return "".join(tokens)

        def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
            return ()

    tok = StandInTokenizer()
    for content, i in added.items():  # each added token (an image placeholder, a role tag) stays one token
        if content not in roles.values():
            tok.add_tokens([content], special_tokens=True)
            tok._fixed[content] = i
            tok._by_id[i] = content
    return tok


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


def test_image(config: dict[str, Any], seed: int, path: Path) -> Path:
    """A deterministic noise RGB image (PNG), square, at most TEST_IMAGE_MAX_SIDE pixels a side."""
    import numpy as np
    from PIL import Image

    side = min(int(nested(config, "image_size") or 64), TEST_IMAGE_MAX_SIDE)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), "RGB").save(path)
    return path


def preprocessing_arguments(fn: Any, tokenizer: Any, config: dict[str, Any], seed: int, workdir: Path,
                            max_new_tokens: int) -> dict[str, Any]:
    """Arguments for an infer-style method: the tokenizer, a test prompt (with the method's image
    placeholder when it takes an image), a test image, a scratch output folder; defaults elsewhere."""
    params = inspect.signature(fn).parameters
    if "tokenizer" not in params:
        raise PreprocessingFailed(f"{fn.__name__} takes no tokenizer")
    args: dict[str, Any] = {"tokenizer": tokenizer}
    image_param = next((n for n in params if _IMAGE_PARAM.match(n)), None)
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
        elif p.default is p.empty:
            raise PreprocessingFailed(f"{fn.__name__} needs {name!r}, which npuport cannot supply")
    return args


def _model_float_dtype(model: Any) -> Any:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def cast_floats(value: Any, dtype: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if dtype is not None and value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


def _has_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return False


def capture_preprocessed_inputs(model: Any, method_name: str, model_dir: Path, config: dict[str, Any], seed: int,
                                max_new_tokens: int = 8) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Call the model's preprocessing method and stop it at its generate call.

    Returns (inputs: the tensor arguments generate got, by name; kwargs: the other arguments, decoding
    controls removed; notes: what was done, for the report). Floating tensors are cast to the model's
    dtype: an infer method typically casts images for an autocast region npuport does not reproduce."""
    import torch

    if method_name == PROCESSOR_PATH:
        return processor_inputs(model, model_dir, config, seed)
    fn = preprocessing_method(model, method_name)
    tokenizer, how = load_tokenizer(model_dir, config)
    original_generate = getattr(model, "generate", None)

    def intercept(*args: Any, **kwargs: Any) -> Any:
        raise _GenerateCalled(args, kwargs)

    captured: _GenerateCalled | None = None
    # the test image and the method's output folder live only for the call: the captured tensors are in memory
    with tempfile.TemporaryDirectory(prefix="npuport-preprocess-") as tmp:
        call = preprocessing_arguments(fn, tokenizer, config, seed, Path(tmp), max_new_tokens)
        model.generate = intercept  # an instance attribute shadows the class's method for self.generate(...)
        model.forward = intercept  # a path that calls self(...) instead
        try:
            with torch.no_grad():
                fn(**call)
        except _GenerateCalled as got:
            captured = got
        except Exception as exc:
            raise PreprocessingFailed(f"{method_name}() failed before calling generate: {type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
        finally:
            del model.generate
            del model.forward
    if captured is None:
        raise PreprocessingFailed(f"{method_name}() returned without calling generate or forward")
    target = original_generate if original_generate is not None else model.forward
    try:
        bound = inspect.signature(target).bind_partial(*captured.call_args, **captured.call_kwargs).arguments
    except TypeError as exc:
        raise PreprocessingFailed(f"{method_name}() called generate with arguments it does not take: {exc}") from exc
    flat: dict[str, Any] = {}
    for name, value in bound.items():
        param = inspect.signature(target).parameters[name]
        if param.kind is param.VAR_KEYWORD:
            flat.update(value)
        elif param.kind is not param.VAR_POSITIONAL:
            flat[name] = value
    if "inputs" in flat and "input_ids" not in flat and isinstance(flat["inputs"], torch.Tensor) \
            and not flat["inputs"].is_floating_point():
        flat["input_ids"] = flat.pop("inputs")  # transformers' generate names its first argument `inputs`
    dtype = _model_float_dtype(model)
    inputs = {k: cast_floats(v, dtype) for k, v in flat.items() if _has_tensor(v)}
    kwargs = {k: v for k, v in flat.items() if not _has_tensor(v) and k not in DECODING_CONTROLS and v is not None}
    if not inputs:
        raise PreprocessingFailed(f"{method_name}() called generate without tensors")
    shapes = ", ".join(f"{k} {_shape(v)}" for k, v in inputs.items())
    notes = [f"inputs built by the model's own preprocessing path {type(model).__name__}.{method_name}() with "
             f"{how}, a test prompt and a test image; its generate call was intercepted: {shapes}"]
    if kwargs:
        notes.append("the preprocessing path's generate arguments kept: "
                     + ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items())))
    if dtype is not None:
        notes.append(f"floating inputs cast to the model's dtype ({str(dtype).removeprefix('torch.')})")
    return inputs, kwargs, notes


def processor_inputs(model: Any, model_dir: Path, config: dict[str, Any],
                     seed: int) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The folder's own processor (AutoProcessor: its tokenizer and image processor) on a test prompt and,
    when it processes images, a test image; the prompt goes through its chat template when it has one,
    so image placeholders are expanded the way the processor does it."""
    try:
        from PIL import Image
        from transformers import AutoProcessor

        proc = AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
        takes_images = getattr(proc, "image_processor", None) is not None
        content: list[dict[str, Any]] = [{"type": "image"}] if takes_images else []
        content.append({"type": "text", "text": TEST_PROMPT})
        if getattr(proc, "chat_template", None):
            text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
            how = "its chat template"
        else:
            mark = getattr(proc, "image_token", None) if takes_images else None
            text, how = (f"{mark}\n{TEST_PROMPT}" if mark else TEST_PROMPT), "no chat template"
        kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if takes_images:
            with tempfile.TemporaryDirectory(prefix="npuport-preprocess-") as tmp:
                kwargs["images"] = [Image.open(test_image(config, seed, Path(tmp) / "test.png")).convert("RGB")]
        out = dict(proc(**kwargs))
    except Exception as exc:
        raise PreprocessingFailed(f"the folder's processor failed: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    dtype = _model_float_dtype(model)
    inputs = {k: cast_floats(v, dtype) for k, v in out.items() if _has_tensor(v)}
    shapes = ", ".join(f"{k} {_shape(v)}" for k, v in inputs.items())
    notes = [f"inputs built by the folder's own processor ({type(proc).__name__}, {how}) from a test prompt"
             + (" and a test image" if takes_images else "") + f": {shapes}"]
    return inputs, {}, notes


def _shape(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shape(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        inner = ", ".join(_shape(v) for v in value[:3]) + (", ..." if len(value) > 3 else "")
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return type(value).__name__
