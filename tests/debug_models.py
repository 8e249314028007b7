"""Toy remote-code folders that fail with the plain Python failures old remote code meets on a newer release,
written by tests into tmp (the SHAPES real releases have, not any release's code):

- ``write_star_import_lm``: the modeling file gets a helper through ``from .toy_utils import *``; the helper
  module now declares ``__all__`` without it (as a newer release of a module does): ``NameError``;
- ``write_no_kwargs_lm``: a ``forward`` written before generate passed its newer keywords, no ``**kwargs``:
  ``TypeError: forward() got an unexpected keyword argument``;
- ``write_token_type_vlm``: a CogVLM-shaped vision-language model whose ``prepare_inputs_for_generation``
  requires ``token_type_ids`` and whose own ``build_conversation_input_ids`` makes them (and the image list);
  made-up token ids fail with ``missing 1 required positional argument: 'token_type_ids'``.
Each is an HF folder (config.json auto_map, a PretrainedConfig, a PreTrainedModel with GenerationMixin)."""

from __future__ import annotations

import json
from pathlib import Path

CONFIGURATION = '''from transformers import PretrainedConfig


class ToyConfig(PretrainedConfig):
    model_type = "{model_type}"

    def __init__(self, vocab_size=96, hidden_size=32, num_hidden_layers=2, image_size=32, image_tokens=4, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.image_size = image_size
        self.image_tokens = image_tokens
        super().__init__(**kwargs)
'''

TOY_UTILS = '''import torch

__all__ = ["ToyMixin"]  # a newer version of the module says what it exports; rotate_half is not among them


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ToyMixin:
    pass
'''

LM = '''import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_toy import ToyConfig
{imports}

class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size)
        self.mix = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h):
        x = self.mix(self.norm(h))
        return h + torch.tanh({mix})


class ToyPreTrainedModel(PreTrainedModel):
    config_class = ToyConfig
    base_model_prefix = "model"


class ToyForCausalLM(ToyPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.num_hidden_layers)])
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.tok

    def forward(self, input_ids, attention_mask=None{extra_params}):
        h = self.tok(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)[:, None]
        for layer in self.layers:
            h = layer(h)
        return CausalLMOutputWithPast(logits=self.lm_head(h).float())
{prepare}'''

OWN_PREPARE = '''
    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}
'''

VLM = '''import numpy as np
import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_toy import ToyConfig

LANGUAGE_TOKEN_TYPE = 0
VISION_TOKEN_TYPE = 1


class ToyPreTrainedModel(PreTrainedModel):
    config_class = ToyConfig
    base_model_prefix = "model"


class ToyVisionForCausalLM(ToyPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.tok = nn.Embedding(config.vocab_size, config.hidden_size)
        self.patch = nn.Linear(3 * (config.image_size // 2) ** 2, config.hidden_size)
        self.mix = nn.Linear(config.hidden_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.tok

    def encode_images(self, images):
        pixels = torch.stack([img for sample in images for img in sample])  # (n, 3, H, W)
        n, c, H, W = pixels.shape
        quads = pixels.reshape(n, c, 2, H // 2, 2, W // 2).permute(0, 2, 4, 1, 3, 5).reshape(n, 4, -1)
        return self.patch(quads)  # (n, 4 image tokens, hidden)

    def forward(self, input_ids, token_type_ids, images=None, attention_mask=None, **kwargs):
        h = self.tok(input_ids)
        if images is not None:
            vision = self.encode_images(images).to(h.dtype)
            h = h.clone()
            h[token_type_ids == VISION_TOKEN_TYPE] = vision.reshape(-1, h.shape[-1])
        h = h.cumsum(1) / torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device)[:, None]
        return CausalLMOutputWithPast(logits=self.lm_head(torch.tanh(self.mix(h))).float())

    def prepare_inputs_for_generation(self, input_ids, token_type_ids, images=None, attention_mask=None, **kwargs):
        grown = input_ids.shape[1] - token_type_ids.shape[1]
        if grown > 0:  # generated tokens are text
            token_type_ids = torch.cat([token_type_ids, token_type_ids.new_zeros(token_type_ids.shape[0], grown)], 1)
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "images": images}

    def build_conversation_input_ids(self, tokenizer, *, query, history=None, images=None):
        """The model's own input builder: the image tokens first, then the prompt's."""
        text = tokenizer.encode(query, add_special_tokens=False)
        n_img = self.config.image_tokens if images else 0
        input_ids = [0] * n_img + text
        token_type_ids = [VISION_TOKEN_TYPE] * n_img + [LANGUAGE_TOKEN_TYPE] * len(text)
        out = {"input_ids": torch.tensor(input_ids), "token_type_ids": torch.tensor(token_type_ids),
               "attention_mask": torch.ones(len(input_ids), dtype=torch.long)}
        if images:
            size = self.config.image_size
            img = images[0].convert("RGB").resize((size, size))
            out["images"] = [torch.tensor(np.asarray(img), dtype=torch.float32).permute(2, 0, 1) / 255.0]
        return out
'''


def _write(root: Path, model_type: str, cls: str, modeling: str, extra: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [cls], "model_type": model_type,
              "auto_map": {"AutoConfig": "configuration_toy.ToyConfig", "AutoModelForCausalLM": f"modeling_toy.{cls}"},
              "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "image_size": 32, "image_tokens": 4,
              "torch_dtype": "float32"}
    (root / "config.json").write_text(json.dumps(config, indent=1))
    (root / "configuration_toy.py").write_text(CONFIGURATION.format(model_type=model_type))
    (root / "modeling_toy.py").write_text(modeling)
    for name, text in (extra or {}).items():
        (root / name).write_text(text)
    return root


def write_star_import_lm(root: Path) -> Path:
    modeling = LM.format(imports="from .toy_utils import *\n", mix="rotate_half(x)", extra_params=", **kwargs",
                         prepare=OWN_PREPARE)
    return _write(root, "toy-star-import", "ToyForCausalLM", modeling, {"toy_utils.py": TOY_UTILS})


def write_no_kwargs_lm(root: Path) -> Path:
    modeling = LM.format(imports="", mix="x", extra_params="", prepare="")
    return _write(root, "toy-no-kwargs", "ToyForCausalLM", modeling)


def write_token_type_vlm(root: Path) -> Path:
    return _write(root, "toy-token-type-vlm", "ToyVisionForCausalLM", VLM)
