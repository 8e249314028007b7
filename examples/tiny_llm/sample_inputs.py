"""Deterministic sample inputs for tiny_llm: a left-padded batch of two short prompts.

make_inputs(config, seed) -> {"input_ids": LongTensor[2, T], "attention_mask": LongTensor[2, T]}
decode(config, token_ids) -> str
Everything is built on the CPU; whoever runs the model moves it to the model's device.
"""

from __future__ import annotations

import torch

# Character vocabulary: ids 0-2 are <pad>, <s>, </s>; the rest are these characters, in order.
SPECIALS = ("<pad>", "<s>", "</s>")
CHARS = " abcdefghijklmnopqrstuvwxyz0123456789.,:;!?'-+*/=()[]<>\n_#@%&"
VOCAB = {**{t: i for i, t in enumerate(SPECIALS)}, **{c: i + len(SPECIALS) for i, c in enumerate(CHARS)}}
ID_TO_TOKEN = {i: t for t, i in VOCAB.items()}

PROMPTS = ("the quick brown fox", "tiny llm, say:", "once upon a time", "2 + 2 =", "hello npu")


def encode(text: str) -> list[int]:
    return [VOCAB["<s>"]] + [VOCAB.get(ch, VOCAB["?"]) for ch in text.lower()]


def make_inputs(config: dict, seed: int) -> dict:
    """Two prompts picked by the seed, left-padded to one length (the mask marks the padding)."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.randperm(len(PROMPTS), generator=g)[:2].tolist()
    rows = [encode(PROMPTS[i]) for i in picks]
    width = max(len(r) for r in rows)
    pad = int(config["pad_token_id"])
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def decode(config: dict, token_ids: list[int]) -> str:
    return "".join(ID_TO_TOKEN.get(int(i), "?") for i in token_ids if int(i) >= len(SPECIALS))
