"""Small remote-code model folders written by the coverage tests (tests/test_coverage.py): a hybrid stack whose
config places its layer kinds by a per-layer list, an audio-language model, a vision-language model without a
processor, and a VLM whose tower takes an input npuport cannot build. None is any release's code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HOST_TRANSFORMERS = "5.0.0"  # no era of its own: the port runs in npuport's own interpreter

COMMON = '''import torch
from torch import nn


class SoftmaxAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d, heads, ffn, mixer=None):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mixer = mixer if mixer is not None else SoftmaxAttention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

    def forward(self, x):
        x = x + self.mixer(self.norm(x))
        return x + self.mlp(x)


class TextModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c["hidden_size"], c["num_attention_heads"], c["intermediate_size"])
                                    for _ in range(c["num_hidden_layers"]))
        self.head = nn.Linear(c["hidden_size"], c["vocab_size"])

    def forward(self, embeds):
        for layer in self.layers:
            embeds = layer(embeds)
        return self.head(embeds)


def greedy(step, input_ids, max_new_tokens):
    ids = input_ids
    for _ in range(max_new_tokens):
        ids = torch.cat([ids, step(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids
'''

HYBRID = COMMON + '''

class LinearAttention(nn.Module):
    """A causal linear-attention mixer: a running sum of k v^T."""

    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        kv = torch.cumsum(k.softmax(-1).unsqueeze(-1) * v.unsqueeze(-2), dim=1)
        return self.out((q.softmax(-1).unsqueeze(-2) @ kv).squeeze(-2))


class HybridLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, heads, ffn = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
        self.embed = nn.Embedding(config["vocab_size"], d)
        self.layers = nn.ModuleList(
            Block(d, heads, ffn, LinearAttention(d) if kind == "linear_attention" else None)
            for kind in config["layer_types"][:config["num_hidden_layers"]])
        self.head = nn.Linear(d, config["vocab_size"])

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        return greedy(self.forward, input_ids, max_new_tokens)
'''

AUDIO = COMMON + '''

class AudioEncoder(nn.Module):
    """Whisper-shaped: two convolutions (the second halves the frames), positions, blocks."""

    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.conv1 = nn.Conv1d(c["num_mel_bins"], d, 3, padding=1)
        self.conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        self.positions = nn.Embedding(c["max_source_positions"], d)
        self.layers = nn.ModuleList(Block(d, c["encoder_attention_heads"], c["encoder_ffn_dim"])
                                    for _ in range(c["encoder_layers"]))

    def forward(self, input_features):
        x = nn.functional.gelu(self.conv2(nn.functional.gelu(self.conv1(input_features)))).transpose(1, 2)
        x = x + self.positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return x


class AudioLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.audio_tower = AudioEncoder(config["audio_config"])
        # the projection feeds the text model: its width is the text model's
        self.projector = nn.Sequential(nn.Linear(config["audio_config"]["d_model"], config["hidden_size"]), nn.GELU(),
                                       nn.Linear(config["hidden_size"], config["hidden_size"]))
        self.language_model = TextModel(config["text_config"])

    def forward(self, input_ids, input_features=None):
        embeds = self.language_model.embed(input_ids)
        if input_features is not None:
            audio = self.projector(self.audio_tower(input_features))[:, :4]
            embeds = torch.cat([audio, embeds], 1)
        return self.language_model(embeds)[:, -input_ids.shape[1]:]

    @torch.no_grad()
    def generate(self, input_ids, input_features=None, attention_mask=None, max_new_tokens=4):
        return greedy(lambda ids: self.forward(ids, input_features), input_ids, max_new_tokens)
'''

# A processor whose audio part is named, not shipped (no preprocessor_config.json): transformers' Whisper feature
# extractor, and a tokenizer the folder does not hold either.
AUDIO_PROCESSOR = '''import torch
from transformers import BatchFeature, ProcessorMixin


class ToyAudioProcessor(ProcessorMixin):
    attributes = ["feature_extractor", "tokenizer"]
    feature_extractor_class = "WhisperFeatureExtractor"
    tokenizer_class = "AutoTokenizer"
    audio_token = "<audio>"

    def __init__(self, feature_extractor=None, tokenizer=None, **kwargs):
        super().__init__(feature_extractor, tokenizer, **kwargs)

    def __call__(self, text=None, audio=None, sampling_rate=None, return_tensors=None, **kwargs):
        features = self.feature_extractor(audio, sampling_rate=sampling_rate, padding="longest",
                                          return_tensors="pt").input_features
        ids = self.tokenizer(text, return_tensors="pt")
        return BatchFeature({"input_ids": ids.input_ids, "input_features": features})
'''

VLM = COMMON + '''

class VisionTower(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, p = c["hidden_size"], c["patch_size"]
        self.patches = nn.Conv2d(c["num_channels"], d, p, stride=p)
        self.positions = nn.Parameter(torch.zeros((c["img_size"] // p) ** 2, d))
        self.layers = nn.ModuleList(Block(d, c["num_attention_heads"], c["intermediate_size"])
                                    for _ in range(c["num_hidden_layers"]))

    def forward(self, image):
        x = self.patches(image).flatten(2).transpose(1, 2) + self.positions  # only the configured image size fits
        for layer in self.layers:
            x = layer(x)
        return x


class PrefixVLM(nn.Module):
    """Image features prefixed to the prompt: the image goes in as ``{PIXELS}``."""

    def __init__(self, config):
        super().__init__()
        self.visual = VisionTower(config["vision_config"])
        self.mm_projector = nn.Linear(config["vision_config"]["hidden_size"], config["text_config"]["hidden_size"])
        self.language_model = TextModel(config["text_config"])

    def forward(self, input_ids, {PIXELS}=None):
        embeds = self.language_model.embed(input_ids)
        if {PIXELS} is not None:
            embeds = torch.cat([self.mm_projector(self.visual({PIXELS})), embeds], 1)
        return self.language_model(embeds)[:, -input_ids.shape[1]:]

    @torch.no_grad()
    def generate(self, input_ids, {PIXELS}=None, attention_mask=None, max_new_tokens=4):
        return greedy(lambda ids: self.forward(ids, {PIXELS}), input_ids, max_new_tokens)

    def update_special_tokens(self, tokenizer):
        """The image token this model's prompts carry, added to the tokenizer (the authors' usage)."""
        tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
        self.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
        return tokenizer
'''

TEXT_CONFIG = {"vocab_size": 96, "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 1024,
               "num_hidden_layers": 3}


def _write(root: Path, module: str, cls: str, source: str, config: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(source)
    (root / "config.json").write_text(json.dumps({"auto_map": {"AutoModelForCausalLM": f"{module}.{cls}"},
                                                  "transformers_version": HOST_TRANSFORMERS, **config}, indent=1))
    return root


# The first three layers are linear attention, the fourth softmax attention: the first two layers are one kind.
LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 2


def write_hybrid(root: Path) -> Path:
    return _write(root, "modeling_hybrid", "HybridLM", HYBRID,
                  {**TEXT_CONFIG, "num_hidden_layers": len(LAYER_TYPES), "layer_types": LAYER_TYPES})


def write_audio_lm(root: Path, processor: bool = False) -> Path:
    """An audio-language model whose projection (the top level's ``hidden_size``) feeds the text model; with
    ``processor``, a processor_config.json naming its processor, whose feature extractor the folder lacks."""
    _write(root, "modeling_audio_lm", "AudioLM", AUDIO, {
        "hidden_size": TEXT_CONFIG["hidden_size"], "text_config": TEXT_CONFIG, "vocab_size": TEXT_CONFIG["vocab_size"],
        "eos_token_id": 1, "audio_config": {"num_mel_bins": 16, "d_model": 384, "encoder_layers": 3,
                                            "encoder_attention_heads": 6, "encoder_ffn_dim": 768,
                                            "max_source_positions": 64, "sampling_rate": 16000}})
    if processor:
        (root / "processing_audio_lm.py").write_text(AUDIO_PROCESSOR)
        (root / "processor_config.json").write_text(json.dumps(
            {"auto_map": {"AutoProcessor": "processing_audio_lm.ToyAudioProcessor"},
             "processor_class": "ToyAudioProcessor"}))
    return root


def write_vlm(root: Path, pixels: str = "image_tensor") -> Path:
    """A VLM without a processor whose pixels go in as ``pixels`` at the config's ``img_size``."""
    return _write(root, "modeling_vlm", "PrefixVLM", VLM.replace("{PIXELS}", pixels), {
        "text_config": TEXT_CONFIG, "vocab_size": TEXT_CONFIG["vocab_size"],
        "vision_config": {"img_size": 48, "patch_size": 16, "num_channels": 3, "hidden_size": 256,
                          "num_attention_heads": 4, "intermediate_size": 512, "num_hidden_layers": 3}})


def write_tokenizer_and_image_processor(root: Path, side: int) -> None:
    """A tokenizer.json (characters) and a transformers image processor, with no processor class joining them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPImageProcessor, PreTrainedTokenizerFast

    chars = ["[UNK]", "[PAD]", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .\n"]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(root)
    CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}).save_pretrained(root)
