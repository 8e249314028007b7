"""The tokenizer the preprocessing path gets: the folder's own (AutoTokenizer over tokenizer.json,
tokenizer.model, ... or a tokenizer_config.json whose custom class loads), else a stand-in: deterministic
character ids within the vocabulary that avoid the special ids, with the special tokens of
tokenizer_config.json. Self-contained; ships in the bundle beside run.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

if __package__:
    from .inputs_base import TOKENIZER_FILES, PreprocessingFailed, nested_int
else:  # beside a bundle's run.py
    from inputs_base import TOKENIZER_FILES, PreprocessingFailed, nested_int  # type: ignore[no-redef]


def has_tokenizer_files(model_dir: Path) -> list[str]:
    return [f for f in TOKENIZER_FILES if (Path(model_dir) / f).is_file()]


_TOKENIZERS: dict[tuple[str, int], tuple[Any, str]] = {}  # one per model folder and vocabulary: built once


def load_tokenizer(model_dir: Path, config: dict[str, Any]) -> tuple[Any, str]:
    """The folder's tokenizer through AutoTokenizer when it has tokenizer files, else a stand-in."""
    key = (str(model_dir), (nested_int(config, "vocab_size") or 0))
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
    tok = stand_in_tokenizer(model_dir, config)
    structure = (f"; prompts get the special tokens the model's own {tok.npuport_borrowed} adds"
                 if getattr(tok, "npuport_borrowed", "") else
                 f"; the model's own tokenizer class was not usable ({OWN_CLASS_ERRORS[str(model_dir)]}), so prompts "
                 "get transformers' default special tokens" if str(model_dir) in OWN_CLASS_ERRORS else "")
    return tok, (
        f"a stand-in tokenizer ({why}): character ids within the vocabulary, the special tokens of "
        f"tokenizer_config.json with the ids config.json gives them{structure}; the text differs from the real "
        "tokenizer's, the structure built around it is the model's own")


STANDARD_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / "tokenizer_config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        cfg = {}
    return cfg if isinstance(cfg, dict) else {}


def _content(value: Any) -> str | None:
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def special_tokens(model_dir: Path, config: dict[str, Any] | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """(content -> id, role -> content): the added tokens of tokenizer_config.json (``added_tokens_decoder``)
    and added_tokens.json, and every ``X_token`` that tokenizer_config.json names (bos, eos, pad, unk, and the
    model's own: ``gmask_token``, ``end_token``...), with the id the model's config gives as ``X_token_id``
    (the ids its code compares against: ``config.gmask_token_id``, ``config.bos_token_id``)."""
    cfg = _tokenizer_config(model_dir)
    ids: dict[str, int] = {}
    for key, tok in (cfg.get("added_tokens_decoder") or {}).items():
        content = _content(tok)
        if content is not None and str(key).isdigit():
            ids[content] = int(key)
    try:
        extra = json.loads((Path(model_dir) / "added_tokens.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        extra = {}
    for content, i in (extra.items() if isinstance(extra, dict) else ()):
        if isinstance(content, str) and isinstance(i, int):
            ids.setdefault(content, i)
    roles: dict[str, str] = {}
    for key, value in cfg.items():
        content = _content(value)
        if key.endswith("_token") and content:
            roles[key] = content
            token_id = (config or {}).get(f"{key}_id")
            if isinstance(token_id, int) and token_id >= 0:
                ids.setdefault(content, token_id)
    return ids, roles


def _own_tokenizer_class(model_dir: Path) -> Any:
    """The tokenizer class the model's own code defines (tokenizer_config.json ``auto_map['AutoTokenizer']``),
    imported without building it (its vocabulary file may be missing); None when there is none."""
    auto = (_tokenizer_config(model_dir).get("auto_map") or {}).get("AutoTokenizer")
    ref = next((r for r in auto if r), None) if isinstance(auto, list | tuple) else auto
    if not isinstance(ref, str) or "." not in ref:
        return None
    ref = ref.split("--", 1)[-1]
    try:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module
    except ImportError:
        return None
    module, _, name = ref.rpartition(".")
    for call in (lambda: get_class_from_dynamic_module(ref, str(model_dir), local_files_only=True),  # 4.29+
                 lambda: get_class_from_dynamic_module(str(model_dir), f"{module}.py", name)):  # older releases
        try:
            return call()
        except TypeError as exc:
            OWN_CLASS_ERRORS[str(model_dir)] = f"TypeError: {exc}"
            continue
        except Exception as exc:  # noqa: BLE001  (tried from the folder itself below)
            first = str(exc).splitlines()[0][:160] if str(exc) else ""
            OWN_CLASS_ERRORS[str(model_dir)] = f"{type(exc).__name__}: {first}"
            break
    return _own_class_from_file(model_dir, module, name)


def _own_class_from_file(model_dir: Path, module: str, name: str) -> Any:
    """The class imported from the folder's file itself, when transformers' module cache cannot take it (a
    cache the run may not write, a read-only copy it tries to overwrite); None when it does not import here:
    the stand-in then keeps transformers' default structure."""
    import importlib.util
    import sys

    path = Path(model_dir) / f"{module.replace('.', '/')}.py"
    if not path.is_file():
        return None
    unique = f"npuport_own_tokenizer_{abs(hash(str(path)))}"
    try:
        spec = importlib.util.spec_from_file_location(unique, path)
        if spec is None or spec.loader is None:
            return None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[unique] = loaded
        spec.loader.exec_module(loaded)
        OWN_CLASS_ERRORS.pop(str(model_dir), None)
        return getattr(loaded, name, None)
    except Exception as exc:  # it does not import here: the stand-in keeps transformers' default structure
        sys.modules.pop(unique, None)
        OWN_CLASS_ERRORS[str(model_dir)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        return None


# why the model's own tokenizer class could not be had, per folder (for the report)
OWN_CLASS_ERRORS: dict[str, str] = {}


class _Vocabulary:
    """What the model's tokenizer code reaches through ``self`` for its vocabulary (``self.sp_tokenizer[tok]``,
    ``self.special_tokens[tok]``, ``self.sp_model.piece_to_id(tok)``): every lookup answers with the stand-in's
    id for that token."""

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def __getitem__(self, token: str) -> int:
        return int(self._tok.convert_tokens_to_ids(token))

    def __contains__(self, token: object) -> bool:
        return isinstance(token, str)

    def __call__(self, token: str, *args: Any, **kwargs: Any) -> int:
        return self[token]

    def get(self, token: str, default: Any = None) -> int:
        return self[token]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self


class _AsOwnTokenizer:
    """``self`` for a method borrowed from the model's own tokenizer class: the stand-in's attributes, then
    the settings the real one would have (tokenizer_config.json's values over its ``__init__`` defaults:
    ``gmask_token``, ``add_bos_token``...), then its vocabulary under whatever name the code uses."""

    def __init__(self, tok: Any, settings: dict[str, Any]) -> None:
        self._tok = tok
        self._settings = settings

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._tok, name)
        except AttributeError:
            if name in self._settings:
                return self._settings[name]
            if name.startswith("_"):
                raise
            return _Vocabulary(self._tok)


def _own_settings(own: Any, model_dir: Path) -> dict[str, Any]:
    """The real tokenizer's settings: its ``__init__`` defaults, tokenizer_config.json's values over them."""
    import inspect

    out: dict[str, Any] = {}
    try:
        params = inspect.signature(own.__init__).parameters.values()
    except (TypeError, ValueError):
        params = []  # type: ignore[assignment]
    for p in params:
        if p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            out[p.name] = p.default
    for key, value in _tokenizer_config(model_dir).items():
        out[key] = _content(value) if isinstance(value, dict) and "content" in value else value
    return out


def stand_in_tokenizer(model_dir: Path, config: dict[str, Any]) -> Any:
    """A transformers PreTrainedTokenizer whose ids are deterministic per character (encode, decode,
    __call__, the special-token ids all work as a real tokenizer's do). The special tokens keep the ids the
    model's config names, and the prompt gets the special tokens the model's own tokenizer class adds
    (its ``build_inputs_with_special_tokens``, run on the stand-in: ChatGLM's ``[gMASK] <sop>`` suffix, a
    BOS prefix, ...)."""
    from transformers import PreTrainedTokenizer

    vocab_size = (nested_int(config, "vocab_size") or 256)
    added, roles = special_tokens(model_dir, config)
    added = {t: i for t, i in added.items() if i < vocab_size}
    for role, default_id in (("bos_token", config.get("bos_token_id")), ("eos_token", config.get("eos_token_id"))):
        if role not in roles and isinstance(default_id, int) and default_id < vocab_size:
            roles[role] = f"<npuport_{role}>"
            added[roles[role]] = default_id
    taken = set(added.values())
    free = [i for i in range(vocab_size) if i not in taken][:4096]
    if not free:
        raise PreprocessingFailed("the vocabulary has no ids left for a stand-in tokenizer")
    own = _own_tokenizer_class(model_dir)
    borrowed = own.__dict__.get("build_inputs_with_special_tokens") if own is not None else None
    settings = _own_settings(own, model_dir) if callable(borrowed) else {}
    standard = {r: t for r, t in roles.items() if r in STANDARD_ROLES and t in added}

    class StandInTokenizer(PreTrainedTokenizer):  # type: ignore[misc,valid-type]
        model_input_names = ["input_ids", "attention_mask"]

        def __init__(self, **kwargs: Any) -> None:
            self._fixed = dict(added)
            self._by_id = {i: t for t, i in added.items()}
            super().__init__(**standard, **kwargs)

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

        def build_inputs_with_special_tokens(self, token_ids_0: list[int],
                                             token_ids_1: list[int] | None = None) -> list[int]:
            if callable(borrowed):  # the model's own tokenizer class decides which special tokens a prompt gets
                try:
                    return list(borrowed(_AsOwnTokenizer(self, settings), token_ids_0, token_ids_1))
                except Exception:  # noqa: S110  (it reaches for something the stand-in cannot give)
                    pass
            return list(super().build_inputs_with_special_tokens(token_ids_0, token_ids_1))

        def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
            return ()

    tok = StandInTokenizer()
    tok.npuport_borrowed = f"{own.__name__}.build_inputs_with_special_tokens" if callable(borrowed) and own else ""
    standard_contents = set(standard.values())
    for content, i in added.items():  # each added token (an image placeholder, a role tag) stays one token
        if content not in standard_contents:
            tok.add_tokens([content], special_tokens=True)
            tok._fixed[content] = i
            tok._by_id[i] = content
    return tok
