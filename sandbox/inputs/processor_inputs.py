"""Inputs from the folder's own processor (its image processor and tokenizer) on a test prompt and a test
image, the way a vision-language release's authors feed their model.

- The processor is AutoProcessor's; when the folder's tokenizer files are not here (an LFS file, a file
  too large for the release's copy) the processor class is built from its image processor and a stand-in
  tokenizer (sandbox/inputs/stand_in_tokenizer.py: the special tokens of tokenizer_config.json / added_tokens.json
  keep their ids, so image placeholders stay the ids the model's code looks for).
- It is called the way its class takes input: ``__call__``, or the class's own ``process`` method.
- One example without a batch axis (``input_ids`` of one dimension) becomes a batch of one.
- When the model class has its own generate wrapper that takes the processor's batch
  (``generate_from_batch(batch, generation_config)``), the batch goes through it and its generate call is
  intercepted: the masks and positions the wrapper derives are the model's own.

Self-contained; ships in the bundle beside run.py."""

from __future__ import annotations

import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

if __package__:
    from .generate_capture import call_until_generate, generate_arguments
    from .inputs_base import (
        PROCESSOR_FILES,
        TEST_PROMPT,
        PreprocessingFailed,
        cast_floats,
        has_tensor,
        model_float_dtype,
        shape_text,
        test_image,
        with_embedding_rows,
    )
    from .stand_in_tokenizer import load_tokenizer
    from .tower_inputs import (
        audio_argument,
        audio_placeholder,
        processor_attributes,
        processor_part,
        processor_settings,
        test_audio,
    )
else:  # beside a bundle's run.py
    from generate_capture import call_until_generate, generate_arguments  # type: ignore[no-redef]
    from inputs_base import (  # type: ignore[no-redef]
        PROCESSOR_FILES,
        TEST_PROMPT,
        PreprocessingFailed,
        cast_floats,
        has_tensor,
        model_float_dtype,
        shape_text,
        test_image,
        with_embedding_rows,
    )
    from stand_in_tokenizer import load_tokenizer  # type: ignore[no-redef]
    from tower_inputs import (  # type: ignore[no-redef]
        audio_argument,
        audio_placeholder,
        processor_attributes,
        processor_part,
        processor_settings,
        test_audio,
    )

BATCH_PARAMS = ("batch", "inputs", "model_inputs", "input_dict", "data", "example")


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _processor_class(model_dir: Path) -> Any:
    """The processor class the folder names (``auto_map['AutoProcessor']`` of processor_config.json /
    preprocessor_config.json / tokenizer_config.json, else ``processor_class`` from transformers)."""
    import transformers

    for name in (*PROCESSOR_FILES, "tokenizer_config.json"):
        try:
            cfg = json.loads((Path(model_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        ref = (cfg.get("auto_map") or {}).get("AutoProcessor") if isinstance(cfg, dict) else None
        if isinstance(ref, str) and "." in ref:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            ref = ref.split("--", 1)[-1]
            module, _, cls = ref.rpartition(".")
            try:
                return get_class_from_dynamic_module(ref, str(model_dir), local_files_only=True)
            except TypeError:  # older releases: (path, module file, class name)
                return get_class_from_dynamic_module(str(model_dir), f"{module}.py", cls)
        if isinstance(cfg, dict) and isinstance(cfg.get("processor_class"), str) \
                and hasattr(transformers, cfg["processor_class"]):
            return getattr(transformers, cfg["processor_class"])
    raise PreprocessingFailed("the folder names no processor class")


def _with_stand_in_tokenizer(model_dir: Path, config: dict[str, Any]) -> tuple[Any, str]:
    """The folder's processor class over its own image processor and a stand-in tokenizer."""
    from transformers import AutoImageProcessor

    cls = _processor_class(model_dir)
    tokenizer, how = load_tokenizer(model_dir, config)
    parts: dict[str, Any] = {}
    built: list[str] = []
    for attr in processor_attributes(cls, ["image_processor", "tokenizer"]):
        if attr == "tokenizer":
            parts[attr] = tokenizer
        elif attr == "image_processor":
            parts[attr] = AutoImageProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
        else:  # an audio processor or feature extractor the folder names but does not hold
            try:
                parts[attr], part_how = processor_part(cls, attr, model_dir, config, tokenizer)
            except Exception as exc:
                raise PreprocessingFailed(f"the processor also needs a {attr}, which npuport could not build "
                                          f"({_first_line(exc)})") from exc
            built.append(f"its {attr} {part_how}")
    # The class may insist on its tokenizer's class (Qwen2Tokenizer): the stand-in is a tokenizer, not that one.
    relaxed = type(cls.__name__, (cls,), {"tokenizer_class": "PreTrainedTokenizerBase"})
    return relaxed(**parts, **processor_settings(cls, model_dir)), how + "".join(f"; {b}" for b in built)


def load_processor(model_dir: Path, config: dict[str, Any]) -> tuple[Any, str]:
    """(processor, how it was built): AutoProcessor over the folder, else its class with a stand-in
    tokenizer when its own tokenizer does not load here."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(str(model_dir), trust_remote_code=True), "its own tokenizer"
    except Exception as exc:
        first = _first_line(exc)
    try:
        proc, how = _with_stand_in_tokenizer(model_dir, config)
    except Exception as exc:
        raise PreprocessingFailed(f"the folder's processor failed: {first}; with a stand-in tokenizer: "
                                  f"{_first_line(exc)}") from exc
    return proc, f"{how} (AutoProcessor failed: {first[:120]})"


def _library(module: str) -> bool:
    """A class of a library (transformers, torch, builtins), not of the release: remote code that
    transformers' loader imports lives in ``transformers_modules.*``, which is the release's own."""
    top = module.split(".")[0]
    return top in ("transformers", "torch", "builtins")


def _own_names(obj: Any) -> set[str]:
    """Attributes the object's class defines outside transformers (the release's own code)."""
    return {k for c in type(obj).__mro__ if not _library(c.__module__) for k in c.__dict__}


def _batched(out: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A processor's single example (input_ids of one dimension) as a batch of one."""
    import torch

    ids = out.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        return out, False
    return {k: v.unsqueeze(0) if isinstance(v, torch.Tensor) else v for k, v in out.items()}, True


def generate_wrapper(model: Any) -> str | None:
    """The model's own method that takes a processor's batch and calls generate (``generate_from_batch``):
    named generate*, defined in the release's code, its first parameter a batch."""
    for cls in type(model).__mro__:
        if _library(cls.__module__):
            continue
        for name, fn in cls.__dict__.items():
            if not (name.startswith("generate") and name != "generate" and callable(fn)):
                continue
            params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
            if params and params[0].name in BATCH_PARAMS:
                return name
    return None


def processor_inputs(model: Any, model_dir: Path, config: dict[str, Any], seed: int,
                     max_new_tokens: int = 8) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The folder's own processor on a test prompt and, when it processes images, a test image; the prompt
    goes through its chat template when it has one, so image placeholders are expanded the way the
    processor does it. Then the model's own generate wrapper, when it has one."""
    config = with_embedding_rows(model, config)  # ids past config.json's vocab_size the model embeds
    try:
        proc, tok_how = load_processor(model_dir, config)
        proc, paired = with_image_processor(model, proc, model_dir)
        tok_how += paired
        out, how, single, fed = _call_processor(proc, config, seed)
    except PreprocessingFailed:
        raise
    except Exception as exc:
        raise PreprocessingFailed(f"the folder's processor failed: {_first_line(exc)}") from exc
    out, batched = _batched({k: v for k, v in out.items() if has_tensor(v)})
    name = type(proc).__name__ + (".process()" if single else "")
    notes = [f"inputs built by the folder's own processor ({name}, {tok_how}, {how}) from a test prompt"
             + "".join(f" and a test {what}" for what in fed)
             + ("; it returned one example without a batch axis, made a batch of one" if batched else "")]
    wrapper = generate_wrapper(model)
    if wrapper is None:
        dtype = model_float_dtype(model)
        inputs = {k: cast_floats(v, dtype) for k, v in out.items()}
        notes[0] += f": {', '.join(f'{k} {shape_text(v)}' for k, v in inputs.items())}"
        return inputs, {}, notes
    inputs, extra = _through_wrapper(model, wrapper, out, getattr(proc, "tokenizer", None), max_new_tokens)
    notes.append(f"the batch went through the model's own {type(model).__name__}.{wrapper}(), whose generate call "
                 f"was intercepted: {', '.join(f'{k} {shape_text(v)}' for k, v in inputs.items())}")
    if extra:
        notes.append("its generate arguments kept: " + ", ".join(f"{k}={v!r}" for k, v in sorted(extra.items())))
    return inputs, extra, notes


def takes_audio(proc: Any) -> bool:
    """The processor holds an audio part (an audio processor, a feature extractor)."""
    return any(("audio" in a or "feature_extractor" in a) and getattr(proc, a, None) is not None
               for a in processor_attributes(type(proc)))


def _prompt(proc: Any, images: bool, audio: bool) -> tuple[str, str]:
    """(the test prompt as the processor takes it, how it was made): through its chat template when it has
    one, else with the placeholder of each kind of data it gets (``<image>``, ``<|audio|>``) before the text."""
    content: list[dict[str, Any]] = [{"type": "image"}] if images else []
    content += [{"type": "audio"}] if audio else []
    content.append({"type": "text", "text": TEST_PROMPT})
    if getattr(proc, "chat_template", None):
        try:
            return proc.apply_chat_template([{"role": "user", "content": content}],
                                            add_generation_prompt=True), "its chat template"
        except Exception:  # noqa: S110  (a template without the audio kind: the placeholders below)
            pass
    marks = [m for m in (getattr(proc, "image_token", None) if images else None,
                         audio_placeholder(proc) if audio else None) if isinstance(m, str) and m]
    return "\n".join([*marks, TEST_PROMPT]), "no chat template"


class TokenizerWithImages:
    """A tokenizer and an image processor the folder holds without a processor class joining them: called like a
    processor, the text through the tokenizer and the images through the image processor."""

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str | None) -> None:
        self.tokenizer, self.image_processor, self.image_token = tokenizer, image_processor, image_token
        self.chat_template = None

    def __call__(self, text: Any, images: Any = None, return_tensors: str = "pt") -> dict[str, Any]:
        out = dict(self.tokenizer(text, return_tensors=return_tensors))
        if images is not None:
            out.update(dict(self.image_processor(images, return_tensors=return_tensors)))
        return out


def _prepared_by_the_model(model: Any, tokenizer: Any) -> tuple[Any, str]:
    """The tokenizer after the model's own method that prepares one (``update_special_tokens(tokenizer)``: it adds
    the image tokens its code looks for and records their ids), when the model has such a method."""
    for cls in type(model).__mro__:
        if _library(cls.__module__):
            continue
        for name, fn in cls.__dict__.items():
            if not callable(fn) or "token" not in name or name.startswith("_"):
                continue
            try:
                params = [p for p in inspect.signature(fn).parameters if p != "self"]
            except (TypeError, ValueError):
                continue
            if params == ["tokenizer"]:
                got = getattr(model, name)(tokenizer)
                return (got if callable(got) else tokenizer), f"{type(model).__name__}.{name}(tokenizer)"
    return tokenizer, ""


def with_image_processor(model: Any, proc: Any, model_dir: Path) -> tuple[Any, str]:
    """``proc`` itself, or, when the folder's processor is a bare tokenizer and the folder holds an image
    processor (preprocessor_config.json), the two joined (TokenizerWithImages), the tokenizer first prepared by
    the model's own method when it has one; the image placeholder is an added token naming an image."""
    if getattr(proc, "image_processor", None) is not None or not callable(getattr(proc, "convert_tokens_to_ids", None)):
        return proc, ""
    try:
        from transformers import AutoImageProcessor

        images = AutoImageProcessor.from_pretrained(str(model_dir), trust_remote_code=True)
    except Exception:  # noqa: BLE001  (no image processor here: the tokenizer alone)
        return proc, ""
    tokenizer, prepared = _prepared_by_the_model(model, proc)
    added = [t for t in getattr(tokenizer, "additional_special_tokens", None) or [] if "image" in t.lower()]
    mark = min(added, key=len) if added else None
    return TokenizerWithImages(tokenizer, images, mark), (
        f"; with the folder's image processor {type(images).__name__}" + (f", the tokenizer prepared by {prepared}"
                                                                         if prepared else ""))


MESSAGE_PARAMS = ("prompts", "messages", "conversation", "conversations", "chat", "dialog", "dialogs")


def messages_param(call: Any) -> str | None:
    """The parameter under which a processor's call takes chat messages instead of ``text`` (``prompts``,
    ``messages``): its first one, when it takes no ``text``."""
    try:
        params = [n for n in inspect.signature(call).parameters if n != "self"]
    except (TypeError, ValueError):
        return None
    return params[0] if params and params[0] in MESSAGE_PARAMS and "text" not in params else None


def _message_shapes(image: str | None) -> list[tuple[str, list[Any]]]:
    """The user turn in the shapes processors read (an image as a dict holding its path, the text as a string
    or a dict), most common first."""
    if image is None:
        return [("text content", [TEST_PROMPT]), ("typed text", [{"type": "text", "text": TEST_PROMPT}])]
    return [("an image dict and a text string", [{"image": image}, TEST_PROMPT]),
            ("typed image and text", [{"type": "image", "image": image}, {"type": "text", "text": TEST_PROMPT}]),
            ("image and text dicts", [{"image": image}, {"text": TEST_PROMPT}])]


def _call_with_messages(call: Any, param: str, image: str | None) -> tuple[dict[str, Any], str]:
    """The processor on one user turn holding the test image and prompt, in the first shape it accepts."""
    errors = []
    for shape, content in _message_shapes(image):
        try:
            return dict(call(**{param: [{"role": "user", "content": content}]})), shape
        except Exception as exc:  # noqa: BLE001  (another shape may be the one its code reads)
            errors.append(f"{shape}: {_first_line(exc)}")
    raise PreprocessingFailed("the processor takes chat messages and refused each shape tried ("
                              + "; ".join(errors) + ")")


def _call_processor(proc: Any, config: dict[str, Any], seed: int) -> tuple[dict[str, Any], str, bool, list[str]]:
    """The processor called on the test prompt, a test image when it processes images and a test waveform when it
    processes audio: (its output, how the prompt was made, whether it took one example, what data it got). A
    ``__call__`` gets a batch of one, or one example when it refuses the batch (``text`` must be a string)."""
    from PIL import Image

    own = _own_names(proc)
    call = proc.process if "process" in own and "__call__" not in own else proc
    images = getattr(proc, "image_processor", None) is not None
    audio_arg = audio_argument(call) if takes_audio(proc) else None
    text, how = _prompt(proc, images, audio_arg is not None)
    fed = [what for what, on in (("image", images), ("waveform", audio_arg is not None)) if on]
    with tempfile.TemporaryDirectory(prefix="npuport-preprocess-") as tmp:
        if (param := messages_param(call)) is not None:  # it takes chat messages, images inside them
            image = str(test_image(config, seed, Path(tmp) / "test.png")) if images else None
            out, shape = _call_with_messages(call, param, image)
            return out, f"chat messages ({shape})", False, fed
        data: dict[str, Any] = {}
        if images:
            data["images"] = Image.open(test_image(config, seed, Path(tmp) / "test.png")).convert("RGB")
        if audio_arg:
            data[audio_arg], rate = test_audio(config, seed)
            if "sampling_rate" in inspect.signature(call).parameters:
                data["sampling_rate"] = rate
        if call is not proc:
            return dict(call(text=text, **data)), how, True, fed
        batch = {k: [v] if k != "sampling_rate" else v for k, v in data.items()}
        try:
            return dict(call(text=[text], **batch, return_tensors="pt")), how, False, fed
        except (TypeError, ValueError):  # one example only (a processor that says batch mode is not supported)
            return dict(call(text=text, **data, return_tensors="pt")), how, False, fed


def _through_wrapper(model: Any, wrapper: str, batch: dict[str, Any], tokenizer: Any,
                     max_new_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Drive the model's generate wrapper with the batch; the arguments of the generate call it makes."""
    from transformers import GenerationConfig

    fn = getattr(model, wrapper)
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if "generation_config" in params:
        kwargs["generation_config"] = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, use_cache=True)
    if "tokenizer" in params and tokenizer is not None:
        kwargs["tokenizer"] = tokenizer
    original = getattr(model, "generate", None)
    captured = call_until_generate(model, lambda: fn(batch, **kwargs), f"{wrapper}()")
    return generate_arguments(model, original if original is not None else model.forward, captured, f"{wrapper}()")
