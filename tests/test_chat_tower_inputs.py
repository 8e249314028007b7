"""A chat that takes the tower's tensor itself (``chat(tokenizer, pixel_values, question, generation_config)``, as
InternVL-style releases write it) is driven: pixels of the config's image size and a greedy generation config go
in, the chat's own code builds the prompt with its image tokens and sets what its generate needs, and the run's
inputs are the ones the chat handed to generate (sandbox/inputs/model_inputs.py preprocessing_arguments). Before,
the chat was skipped ("needs 'pixel_values'") and the synthesised generate failed the model's own assert."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.test_remote_code import chat_folder_run

CHAT_VLM = textwrap.dedent('''
    import torch
    from torch import nn


    class ChatVLM(nn.Module):
        IMG_TOKENS = 4

        def __init__(self, config):
            super().__init__()
            self.vision = nn.Conv2d(3, 16, kernel_size=config["image_size"])
            self.embed = nn.Embedding(config["vocab_size"], 16)
            self.head = nn.Linear(16, config["vocab_size"])
            self.img_context_token_id = None

        def chat(self, tokenizer, pixel_values, question, generation_config, history=None):
            self.img_context_token_id = 3  # what generate asserts: only the chat sets it
            image = [3] * self.IMG_TOKENS if history is None else []  # the first turn carries the image
            ids = torch.tensor([image + tokenizer(question).input_ids])
            return self.generate(pixel_values=pixel_values, input_ids=ids, **generation_config)

        def generate(self, pixel_values=None, input_ids=None, max_new_tokens=4, do_sample=False, **kwargs):
            assert self.img_context_token_id is not None
            h = self.embed(input_ids)
            feats = self.vision(pixel_values).flatten(1)[:, None]  # (1, 1, 16)
            h = torch.where(input_ids[..., None] == self.img_context_token_id, feats, h)
            out = []
            for _ in range(max_new_tokens):
                nxt = self.head(h.mean(1)).argmax(-1)
                out.append(nxt)
                h = torch.cat([h, self.embed(nxt)[:, None]], dim=1)
            return torch.cat([input_ids, torch.stack(out, dim=1)], dim=1)

        def forward(self, input_ids):
            return self.head(self.embed(input_ids))
''')


def test_a_chat_that_takes_pixel_values_is_driven_with_pixels_of_the_config_size(tmp_path: Path) -> None:
    _, res = chat_folder_run(tmp_path, "chatvlm", CHAT_VLM)
    assert res["ok"], res["exception"]
    assert res["inputs"]["source"] == "preprocess", res["inputs"]
    notes = " ".join(res["inputs"]["notes"])
    assert "pixel_values (1, 3, 8, 8)" in notes, notes  # the chat handed generate the pixels npuport built
    tokens = res["outputs"]["tokens"][0]
    assert tokens[:4] == [3, 3, 3, 3] and len(tokens) >= 8  # the chat's own image tokens, then 4 new ones
