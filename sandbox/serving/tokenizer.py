"""The servable folder's tokenizer when the model folder has none that loads (runs inside the sandbox): the
reference ran on npuport's stand-in tokenizer (sandbox/inputs/model_inputs.py: one id per character, the special
tokens of tokenizer_config.json), and vLLM's image processors need a tokenizer object (they look up the
image token and tokenize the prompt around it). This writes the same stand-in as a ``tokenizers``
``tokenizer.json`` (a word-level vocabulary over single characters, the special tokens as added tokens,
every other id named ``<npuport_id_N>`` so any generated id decodes) and a ``tokenizer_config.json`` that
loads it as a plain fast tokenizer, so the server tokenizes the test prompt into the reference's ids.
Whether it did is checked: the server returns the prompt ids it used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
_KEEP = ("bos_token", "eos_token", "pad_token", "unk_token", "added_tokens_decoder", "chat_template",
         "model_max_length", "clean_up_tokenization_spaces")


def write_stand_in(tok: Any, vocab_size: int, model_dir: Path, out_dir: Path, text: str = "") -> list[str]:
    """Write tokenizer.json + tokenizer_config.json reproducing ``tok`` (the stand-in) into ``out_dir``;
    returns the files written."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    fixed: dict[str, int] = dict(getattr(tok, "_fixed", {}))
    vocab: dict[str, int] = {}
    for c in dict.fromkeys(_CHARS + list(text)):
        if c not in fixed:
            vocab[c] = int(tok._convert_token_to_id(c))
    covered = set(vocab.values()) | set(fixed.values())
    vocab.update({f"<npuport_id_{i}>": i for i in range(vocab_size) if i not in covered})
    vocab.update(fixed)
    model = Tokenizer(models.WordLevel(vocab, unk_token=None))
    model.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    model.decoder = decoders.Fuse()
    model.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in fixed])
    model.save(str(out_dir / "tokenizer.json"))
    src = model_dir / "tokenizer_config.json"
    try:
        original = json.loads(src.read_text()) if src.is_file() else {}
    except (OSError, ValueError):
        original = {}
    config = {k: original[k] for k in _KEEP if k in original}
    for role in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tok, role, None)
        if isinstance(value, str) and value in fixed:
            config[role] = value
    config.update({"tokenizer_class": "PreTrainedTokenizerFast", "npuport_stand_in": True})
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False))
    return ["tokenizer.json", "tokenizer_config.json"]
