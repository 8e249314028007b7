"""Config values that are not numbers (sandbox/inputs/inputs_base.py ``nested_int``): a config.json may write
``"vocab_size": "None"`` or ``image_size: [384, 384]``; inputs are built from the sizes the model really has, and
npuport's own code never calls int() on such a value (a held-out speech release failed there, blamed on itself)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from sandbox.inputs.inputs_base import nested_int
from sandbox.inputs.model_inputs import synthesise_inputs


class _Embedder(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(rows, 8)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


def test_nested_int_reads_sizes_and_skips_what_is_not_one() -> None:
    assert nested_int({"vocab_size": "None", "text_config": {"vocab_size": 51865}}, "vocab_size") == 51865
    assert nested_int({"vocab_size": "32000"}, "vocab_size") == 32000
    assert nested_int({"image_size": [384, 384]}, "image_size") == 384
    assert nested_int({"vocab_size": None, "x": {"vocab_size": True}}, "vocab_size") is None
    assert nested_int({"vocab_size": -1}, "vocab_size") is None


def test_token_ids_come_from_the_embedding_when_the_config_writes_no_vocabulary() -> None:
    model = _Embedder(rows=50)
    inputs = synthesise_inputs(model, "forward", {"vocab_size": "None"}, seed=0)
    ids = inputs["input_ids"]
    assert int(ids.max()) < 50 and model(ids).shape[-1] == 8  # every id is a row the model has
    wide = synthesise_inputs(_Embedder(rows=100_000), "forward", {"vocab_size": "None"}, seed=0)["input_ids"]
    assert int(wide.max()) >= 256  # not the 256 fallback: the embedding's own size


def test_the_folders_generation_config_gives_its_token_ids_not_its_decoding(tmp_path: Path) -> None:
    """An encoder-decoder whose decoder_start_token_id lives only in generation_config.json: generate refused
    to start ("decoder_start_token_id or bos_token_id has to be defined") on a model built from config.json."""
    from sandbox.inputs.inputs_base import with_folder_token_ids
    from tests.test_run_method_present import _Config, _GenLM

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"decoder_start_token_id": 7, "eos_token_id": [3, 4], "pad_token_id": True, "num_beams": 3,
         "do_sample": True, "bos_token_id": "None"}))
    model = with_folder_token_ids(_GenLM(_Config()), tmp_path)
    gc = model.generation_config
    assert (gc.decoder_start_token_id, gc.eos_token_id) == (7, [3, 4])
    assert gc.pad_token_id is None and gc.bos_token_id is None  # not token ids: left out
    assert gc.num_beams in (None, 1) and not gc.do_sample  # decoding stays the run's
    (tmp_path / "generation_config.json").write_text("{not json")
    assert with_folder_token_ids(_GenLM(_Config()), tmp_path).generation_config.decoder_start_token_id is None


def test_mel_bins_under_a_nemo_style_encoder_name() -> None:
    """A speech encoder that names its input features ``feat_in`` (NeMo-style configs): the features fed have that
    many bins, not the default 80 (a Conformer's subsampling then met 80 bins where it was built for 128)."""
    from sandbox.inputs.tower_inputs import mel_shape

    bins, _, how = mel_shape({"encoder": {"feat_in": 128, "d_model": 1280}, "preprocessor": {"window": "hann"}})
    assert bins == 128 and "feat_in" in how
    assert mel_shape({"encoder": {"d_model": 1280}})[0] == 80  # nothing named: the default, and said so
