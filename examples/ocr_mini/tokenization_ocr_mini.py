"""Character-level tokenizer for ocr_mini.

One id per character, plus a handful of special tokens. The literal string "<image>" in a
prompt becomes the image placeholder id; the model swaps those positions for image features.
"""

from __future__ import annotations

import json
import os


class OcrMiniTokenizer:
    def __init__(self, vocab: dict[str, int], special_tokens: dict[str, str]):
        self.vocab = dict(vocab)
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.special_tokens = dict(special_tokens)
        self.pad_token_id = self.vocab[special_tokens["pad_token"]]
        self.bos_token_id = self.vocab[special_tokens["bos_token"]]
        self.eos_token_id = self.vocab[special_tokens["eos_token"]]
        self.image_token = special_tokens["image_token"]
        self.image_token_id = self.vocab[self.image_token]
        self.unk_token_id = self.vocab[special_tokens["unk_token"]]
        self.special_ids = {self.vocab[t] for t in special_tokens.values()}

    @classmethod
    def from_pretrained(cls, path: str) -> OcrMiniTokenizer:
        """`path` is the model directory (or the tokenizer.json itself)."""
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        return cls(doc["model"]["vocab"], doc["special_tokens"])

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [self.bos_token_id] if add_bos else []
        for i, chunk in enumerate(text.split(self.image_token)):
            if i > 0:
                ids.append(self.image_token_id)
            ids.extend(self.vocab.get(ch, self.unk_token_id) for ch in chunk)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        pieces = []
        for i in ids:
            i = int(i)
            if skip_special_tokens and i in self.special_ids:
                continue
            pieces.append(self.id_to_token.get(i, "<unk>"))
        return "".join(pieces)
