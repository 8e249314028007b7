"""Deterministic sample inputs for ocr_mini: a synthetic "page of text" image and an OCR prompt.

make_inputs(config, seed) -> {"input_ids": LongTensor[1, T], "pixel_values": FloatTensor[1, 3, H, W]}
decode(config, token_ids) -> str
Everything is built on the CPU; whoever runs the model moves it to the model's device.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT_SUFFIX = "\nread the text:"


@functools.lru_cache(maxsize=1)
def load_tokenizer():
    # Load the sibling file by path so this works however the harness imported us.
    spec = importlib.util.spec_from_file_location("tokenization_ocr_mini", os.path.join(_HERE, "tokenization_ocr_mini.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OcrMiniTokenizer.from_pretrained(_HERE)


def make_image(image_size: int, seed: int) -> torch.Tensor:
    """Dark glyph-like strokes on a light page, in lines of 3x5 "characters". [1, 3, H, W]."""
    g = torch.Generator().manual_seed(seed)
    page = torch.ones(image_size, image_size)
    for top in range(2, image_size - 5, 8):
        for left in range(1, image_size - 3, 4):
            if torch.rand((), generator=g) < 0.15:  # a space between words
                continue
            glyph = (torch.rand(5, 3, generator=g) < 0.5).float()
            page[top : top + 5, left : left + 3] -= 0.8 * glyph
    # A faint paper tint per channel, then the usual [-1, 1] normalisation.
    tint = torch.tensor([1.0, 0.97, 0.92]).view(3, 1, 1)
    image = (page.unsqueeze(0) * tint).clamp(0.0, 1.0)
    return ((image - 0.5) / 0.5).unsqueeze(0)


def make_inputs(config: dict, seed: int) -> dict:
    tokenizer = load_tokenizer()
    # The placeholder is expanded to one token per image feature (num_queries of them).
    prompt = tokenizer.image_token * int(config["num_queries"]) + PROMPT_SUFFIX
    input_ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long)
    pixel_values = make_image(int(config["image_size"]), seed)
    return {"input_ids": input_ids, "pixel_values": pixel_values}


def decode(config: dict, token_ids: list[int]) -> str:
    return load_tokenizer().decode(token_ids)
