"""What feeds a model's towers (a vision encoder, an audio encoder) when nothing of the model builds their
inputs for npuport: the pieces both the synthesised inputs and the folder's processor need.

- Which run-method parameters a tower takes, from their names: pixels (``pixel_values``, ``images``,
  ``image_tensor``, ``vision_x``...), audio features (``input_features``, ``audio_values``, ``speech``...),
  or a raw waveform (``input_values``, ``waveform``); sizes, masks, ids, grids and embeddings are not data.
- Synthesised data of the config's own sizes: an image batch of the image size the config gives under any
  of its spellings (``image_size``, ``img_size``, ``input_resolution``...), mel features of its mel bins
  (``num_mel_bins``, ``n_mels``, ``feature_size``) and frame count (twice ``max_source_positions``: a
  Whisper-style encoder halves the frames it gets, and its positions cover exactly that), a waveform of one
  second at its sample rate.
- The parts of a processor whose own files are not in the folder (an audio processor the release names by
  Hub id): the transformers class the processor class names for it (``audio_processor_class =
  ("WhisperProcessor",)``), built from its own parts, a feature extractor with the config's mel bins and
  sample rate.

Self-contained (torch, numpy, transformers); ships in the bundle beside run.py with the other inputs modules.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

if __package__:
    from .inputs_base import nested, nested_int
else:  # beside a bundle's run.py
    from inputs_base import nested, nested_int  # type: ignore[no-redef]

_PIXEL_WORDS = re.compile(r"pixel|image|img|vision|visual|picture|photo", re.I)
_WAVE_WORDS = re.compile(r"^input_values$|wave|raw_(audio|speech)", re.I)
_AUDIO_WORDS = re.compile(r"audio|speech|^input_features$|(^|_)mels?($|_)|sound|fbank", re.I)
# Parameters about the data rather than the data: sizes, masks, ids, counts, grids, positions, embeddings
_NOT_DATA = re.compile(r"size|shape|mask|token|(^|_)ids?$|idx|index|num|count|len|lens|grid|position|pos($|_)|flag|"
                       r"embed|_start|_end|config|processor|path|file|url|kwargs|seq|attention|hidden|output|"
                       r"feature_extractor|sampling|rate|is_|use_|return", re.I)

IMAGE_SIZE_KEYS = ("image_size", "img_size", "input_resolution", "image_resolution", "vit_input_resolution",
                   "resolution", "input_size", "crop_size")
MEL_KEYS = ("num_mel_bins", "n_mels", "num_mels", "n_mel", "mel_bins", "feature_size",
            "feat_in", "n_mel_channels", "nfilt")  # the last three: NeMo-style encoders and preprocessors
RATE_KEYS = ("sampling_rate", "sample_rate", "audio_sample_rate")
DEFAULT_IMAGE_SIZE = 32
DEFAULT_RATE = 16000
DEFAULT_FRAMES = 100  # one second at the usual 10 ms hop
WAVE_SECONDS = 1.0


def tower_params(names: set[str] | list[str]) -> dict[str, str]:
    """parameter -> "pixels" | "audio" | "waveform", for the parameters of a run method that take a tower's data."""
    found: dict[str, str] = {}
    for name in sorted(names):
        if _NOT_DATA.search(name) and name not in ("input_features", "input_values"):
            continue
        if _WAVE_WORDS.search(name):
            found[name] = "waveform"
        elif _AUDIO_WORDS.search(name):
            found[name] = "audio"
        elif _PIXEL_WORDS.search(name):
            found[name] = "pixels"
    return found


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> tuple[Any, str | None]:
    for key in keys:
        value = nested(config, key)
        if value is not None:
            return value, key
    return None, None


def image_side(config: dict[str, Any]) -> tuple[int, str]:
    """The image side the config gives (an int, or the first of an [h, w] pair), and the key it came from."""
    value, key = _first(config, IMAGE_SIZE_KEYS)
    if isinstance(value, list | tuple) and value and isinstance(value[0], int):
        value = value[0]
    if isinstance(value, dict):
        value = value.get("height") or value.get("shortest_edge")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, str(key)
    return DEFAULT_IMAGE_SIZE, f"no image size in the config: {DEFAULT_IMAGE_SIZE}"


def sample_rate(config: dict[str, Any]) -> int:
    value, _ = _first(config, RATE_KEYS)
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_RATE


def mel_shape(config: dict[str, Any]) -> tuple[int, int, str]:
    """(mel bins, frames, where they came from) of audio features for the config's encoder."""
    bins, key = _first(config, MEL_KEYS)
    bins = int(bins) if isinstance(bins, int) and bins > 0 else 80
    positions = nested(config, "max_source_positions")
    frames = 2 * positions if isinstance(positions, int) and positions > 0 else DEFAULT_FRAMES
    how = (f"{bins} mel bins ({key or 'no mel bins in the config: 80'}) x {frames} frames "
           + ("(2 x max_source_positions)" if frames != DEFAULT_FRAMES else "(one second)"))
    return bins, frames, how


def synthesised_towers(names: set[str] | list[str], config: dict[str, Any], generator: Any,
                       skip: set[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Data for each tower parameter of ``names`` (one of each kind), and a note per tower fed."""
    import torch

    out: dict[str, Any] = {}
    notes: list[str] = []
    done: set[str] = set()
    for name, kind in tower_params(names).items():
        if kind in done or name in (skip or set()):
            continue
        done.add(kind)
        if kind == "pixels":
            side, key = image_side(config)
            chans = (nested_int(config, "num_channels") or 3)
            out[name] = torch.randn(1, chans, side, side, generator=generator)
            notes.append(f"{name}: synthesised pixels (1, {chans}, {side}, {side}), the image size from {key}")
        elif kind == "audio":
            bins, frames, how = mel_shape(config)
            out[name] = torch.randn(1, bins, frames, generator=generator)
            notes.append(f"{name}: synthesised audio features, {how}")
        else:
            rate = sample_rate(config)
            out[name] = torch.randn(1, int(rate * WAVE_SECONDS), generator=generator) * 0.1
            notes.append(f"{name}: a synthesised waveform of {WAVE_SECONDS:g} s at {rate} Hz")
    return out, notes


def test_audio(config: dict[str, Any], seed: int) -> tuple[Any, int]:
    """A deterministic waveform (a tone under noise), one second at the config's sample rate, and the rate."""
    import numpy as np

    rate = sample_rate(config)
    t = np.arange(int(rate * WAVE_SECONDS)) / rate
    noise = np.random.default_rng(seed).normal(0.0, 0.05, t.shape)
    return (0.3 * np.sin(2 * np.pi * 440.0 * t) + noise).astype(np.float32), rate


# ----------------------------------------------------------------------------------------------
# Processor parts the folder does not hold
# ----------------------------------------------------------------------------------------------

# A feature extractor's parameters and the config keys that hold the same value
_EXTRACTOR_ALIASES = {"feature_size": MEL_KEYS, "n_mels": MEL_KEYS, "num_mel_bins": MEL_KEYS,
                      "sampling_rate": RATE_KEYS}


def _transformers_class(names: Any) -> Any:
    import transformers

    for name in (names if isinstance(names, list | tuple) else [names]):
        if isinstance(name, str) and hasattr(transformers, name):
            return getattr(transformers, name)
    return None


def feature_extractor(cls: Any, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``cls`` (a transformers feature extractor) with the config's mel bins and sample rate, and those values."""
    params = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = {}
    for param, keys in _EXTRACTOR_ALIASES.items():
        value, _ = _first(config, keys)
        if param in params and isinstance(value, int) and value > 0:
            kwargs[param] = value
    return cls(**kwargs), kwargs


def processor_attributes(cls: Any, default: list[str] | None = None) -> list[str]:
    """A processor class's parts: ``get_attributes()`` (transformers 5: from its constructor's parameters), else
    its ``attributes`` list (older releases)."""
    get = getattr(cls, "get_attributes", None)
    if callable(get):
        try:
            return list(get())
        except Exception:  # noqa: S110  (an older release's class: its list below)
            pass
    return list(getattr(cls, "attributes", None) or default or [])


def processor_part(owner: Any, attr: str, model_dir: Path, config: dict[str, Any], tokenizer: Any) -> tuple[Any, str]:
    """A processor's part ``attr`` when the folder's processor does not load whole: the folder's own feature
    extractor (preprocessor_config.json), else the transformers class the owner names for it
    (``<attr>_class``), a processor built from its own parts or a feature extractor with the config's sizes."""
    if attr == "tokenizer":
        return tokenizer, "the tokenizer"
    if "feature_extractor" in attr or "audio" in attr:
        try:
            from transformers import AutoFeatureExtractor

            return AutoFeatureExtractor.from_pretrained(str(model_dir)), "the folder's feature extractor"
        except Exception:  # noqa: S110  (not in the folder: the class the processor names, built below)
            pass
    cls = _transformers_class(getattr(owner, f"{attr}_class", None))
    if cls is None:
        raise ValueError(f"the processor's {attr} is not in the folder and names no class of transformers")
    from transformers import ProcessorMixin

    if isinstance(cls, type) and issubclass(cls, ProcessorMixin):
        parts = {a: processor_part(cls, a, model_dir, config, tokenizer)[0] for a in processor_attributes(cls)}
        relaxed = type(cls.__name__, (cls,), {"tokenizer_class": "PreTrainedTokenizerBase"})
        return relaxed(**parts), f"transformers' {cls.__name__} built from its parts"
    extractor, sizes = feature_extractor(cls, config)
    given = ", ".join(f"{k} {v}" for k, v in sizes.items()) or "its defaults"
    return extractor, f"transformers' {cls.__name__} ({given} from the config)"


def processor_settings(cls: Any, model_dir: Path) -> dict[str, Any]:
    """processor_config.json's values that the processor class's constructor takes (stack factor, placeholder)."""
    try:
        saved = json.loads((Path(model_dir) / "processor_config.json").read_text(encoding="utf-8"))
        params = inspect.signature(cls.__init__).parameters
    except (OSError, ValueError, TypeError):
        return {}
    return {k: v for k, v in saved.items() if k in params and k not in processor_attributes(cls)} \
        if isinstance(saved, dict) else {}


def audio_placeholder(proc: Any) -> str | None:
    """The text the processor replaces with audio frames (``audio_placeholder``, ``audio_token``)."""
    for attr in ("audio_placeholder", "audio_token"):
        value = getattr(proc, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def audio_argument(call: Any) -> str | None:
    """The name under which a processor's call takes audio (``audio``, ``audios``, ``raw_speech``)."""
    try:
        params = inspect.signature(call).parameters
    except (TypeError, ValueError):
        return None
    return next((n for n in ("audio", "audios", "raw_speech", "speech") if n in params), None)
