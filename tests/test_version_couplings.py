"""H18 version couplings (agents/rules/h18_version_couplings.py) and the environment of the model's era
(agents/environment/resolve.py), and the dependencies read from what the code does (agents/environment/imports.py).

Meaning: each coupling's reason is checked against the host's transformers 5.x itself (the class without
GenerationMixin really has no generate, the config really lacks max_length), so the rule cannot claim a
break that does not happen."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agents.environment.compat import host_version
from agents.environment.era import era_transformers
from agents.environment.resolve import resolve
from agents.reading.scanner import scan_tree
from agents.rules.h18_version_couplings import config_class_attrs, couplings

HOST_TF = host_version("transformers") or ""
needs_tf5 = pytest.mark.skipif(not HOST_TF.startswith("5."), reason="the host's transformers is not 5.x")

OLD_MODEL = textwrap.dedent('''\
    from torch.nn.functional import *
    from transformers import PreTrainedModel, PretrainedConfig


    class OldConfig(PretrainedConfig):
        def __init__(self, hidden=8, **kw):
            self.hidden = hidden
            super().__init__(**kw)


    class OldPreTrained(PreTrainedModel):
        config_class = OldConfig

        @property
        def _supports_sdpa(self):
            return True


    class OldForCausalLM(OldPreTrained):
        _tied_weights_keys = ["lm_head.weight"]

        def forward(self, ids, head_mask=None) -> List:
            head_mask = self.get_head_mask(head_mask, 2)
            limit = self.config.max_length
            kind = self.config.rope_scaling["type"]
            return [limit, kind, self.config.hidden]

        def prepare_inputs_for_generation(self, ids, **kw):
            return {"ids": ids}
''')


def _rules(source: str, attrs: frozenset[str] = frozenset()) -> dict[str, int]:
    return {c.rule: c.line for c in couplings(source, attrs)}


def test_each_coupling_is_found_with_its_line_and_reason() -> None:
    found = {c.rule: c for c in couplings(OLD_MODEL)}
    assert set(found) == {"inherits-generate", "generation-config-attr", "removed-helper", "flag-property",
                          "tied-weights-list", "rope-scaling-type", "star-import-leak"}
    lines = OLD_MODEL.splitlines()
    assert lines[found["inherits-generate"].line - 1].startswith("class OldForCausalLM")
    assert "config.max_length" in lines[found["generation-config-attr"].line - 1]
    assert "get_head_mask" in lines[found["removed-helper"].line - 1]
    assert "-> List" in lines[found["star-import-leak"].line - 1]
    assert found["inherits-generate"].reason.startswith("needs transformers < 5: `OldForCausalLM` inherits generate")
    assert "torch.nn.functional" in found["star-import-leak"].reason


def test_code_written_for_5x_is_no_coupling() -> None:
    modern = textwrap.dedent('''\
        from typing import List
        from transformers import GenerationMixin, PreTrainedModel


        class NewForCausalLM(PreTrainedModel, GenerationMixin):
            _supports_sdpa = True
            _tied_weights_keys = {"lm_head.weight": "embed.weight"}

            def forward(self, ids) -> List:
                return [self.generation_config.max_length, self.config.rope_scaling["rope_type"]]

            def prepare_inputs_for_generation(self, ids, **kw):
                return {"ids": ids}
    ''')
    assert couplings(modern) == []
    # a config class that sets the generation attribute itself (any file) makes the read no coupling
    own = config_class_attrs(["from transformers import PretrainedConfig\nclass C(PretrainedConfig):\n"
                              "    def __init__(self):\n        self.max_length = 9\n"])
    assert "max_length" in own
    assert "generation-config-attr" not in _rules(OLD_MODEL, own)
    # an explicitly imported typing name is not leaked by the star import
    assert "star-import-leak" not in _rules("from typing import List\n" + OLD_MODEL)


@needs_tf5
def test_the_reasons_hold_on_the_hosts_transformers_5(tmp_path: Path) -> None:
    """Meaning: under 5.x the old class really has no generate and its config no max_length; the same
    class with GenerationMixin among its bases has generate (what the rule tells apart)."""
    import transformers
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel

    class Cfg(PretrainedConfig):
        model_type = "npuport-h23-probe"

    class Old(PreTrainedModel):
        config_class = Cfg

        def prepare_inputs_for_generation(self, ids, **kw):
            return {"ids": ids}

    class New(PreTrainedModel, GenerationMixin):
        config_class = Cfg

    assert transformers.__version__.startswith("5.")
    assert not hasattr(Old, "generate") and hasattr(New, "generate")
    assert not hasattr(Cfg(), "max_length")
    assert not hasattr(PreTrainedModel, "get_head_mask")


def test_the_scan_reports_the_couplings_as_h18_findings(tmp_path: Path) -> None:
    (tmp_path / "modeling_old.py").write_text(OLD_MODEL)
    findings = [f for f in scan_tree(tmp_path).findings if f.hazard == "H18"]
    assert {f.rule for f in findings} >= {"inherits-generate", "removed-helper", "tied-weights-list"}
    assert all(f.file == "modeling_old.py" and f.line > 0 and not f.fixable for f in findings)
    assert any(f.message.startswith("needs transformers < 5") for f in findings)


def _model(tmp_path: Path, saved: str | None, source: str) -> Path:
    model = tmp_path / "my-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"transformers_version": saved} if saved else {}))
    (model / "modeling_x.py").write_text(source)
    return model


def test_era_of_a_saved_release() -> None:
    assert era_transformers("4.36.2", "5.25.0") == "transformers~=4.36.0"
    assert era_transformers("5.1.0", "5.25.0") is None  # same major: the host's API is the code's
    assert era_transformers("3.5.1", "5.25.0") is None  # no wheel for this Python
    assert era_transformers(None, "5.25.0") is None and era_transformers("junk", "5.25.0") is None


@needs_tf5
def test_resolve_runs_an_old_release_in_its_era_and_infers_one_from_couplings(tmp_path: Path) -> None:
    saved = resolve(_model(tmp_path / "a", "4.30.2", "import torch\n"), "cpu", None)
    # (the era's base env also holds einops, which its Ascend integration imports, unless the host has it)
    assert saved.install[0] == "transformers~=4.30.0" and set(saved.install[1:]) <= {"einops"}
    assert saved.needs_layered_env
    assert any("environment of the model's era" in n for n in saved.notes)
    # config.json names no release; the code's couplings pick the last 4.x and the note says where
    inferred = resolve(_model(tmp_path / "b", None, OLD_MODEL), "ascend-sim", "2.13.0")
    # (on an Ascend target the era's transformers also needs einops, unless the host has it)
    assert inferred.install[0] == "transformers<4.50" and set(inferred.install[1:]) <= {"einops"}
    assert any("modeling_x.py:" in n and "needs transformers < 5" in n for n in inferred.notes)
    # neither: the host's release
    plain = resolve(_model(tmp_path / "c", None, "import torch\n"), "cpu", None)
    assert "transformers" not in " ".join(plain.install)


def test_guarded_imports_the_code_requires_and_self_imports(tmp_path: Path) -> None:
    source = textwrap.dedent('''\
        import torch
        from my_model.configuration_x import XConfig
        from transformers_modules.my_model.helpers import h
        try:
            from einops import rearrange
        except ImportError:
            rearrange = None
        try:
            import some_optional_probe_pkg
        except ImportError:
            pass
        try:
            from flash_attn import flash_attn_func
        except ImportError:
            flash_attn_func = None


        try:
            import tensorflow as tf
        except ImportError:
            raise


        def f(x):
            assert rearrange is not None, "einops is required"
            if flash_attn_func is not None:
                return flash_attn_func(x)
            return rearrange(x, "a b -> b a")


        def g(x):
            if flash_attn_func is None:
                raise ImportError("install flash-attn")
            return some_optional_probe_pkg.run(tf.constant(x))
    ''')
    res = resolve(_model(tmp_path, "5.0.0", source), "cpu", None)
    everything = res.install + res.optional + list(res.pins)
    # the model's own package (the folder's name, as the loader spells it) is never sent to pip
    assert not any(n.startswith(("my-model", "my_model", "transformers-modules")) for n in everything)
    # einops is used after its guarded import: installed (optional) unless the host has it
    assert "einops" in res.optional or host_version("einops")
    # used but never demanded (no assert / raise on it), or another framework: not installed; a
    # CUDA-only guarded import the code demands: dropped (H3 removes or replaces its uses)
    assert "some-optional-probe-pkg" not in everything and "tensorflow" not in everything
    assert "CUDA-only" in res.dropped["flash-attn"]


def test_the_harness_builds_remote_code_as_the_auto_classes_hand_it_out(tmp_path: Path) -> None:
    """A generative PreTrainedModel written before 4.50 (prepare_inputs_for_generation, no GenerationMixin)
    gets generate the way AutoModel*.from_pretrained(trust_remote_code=True) gives it; an encoder does not."""
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

    from sandbox.harness.model_build import build_model

    class ProbeConfig(PretrainedConfig):
        model_type = "npuport-h18-harness-probe"

    class Lm(PreTrainedModel):
        config_class = ProbeConfig

        def __init__(self, config: ProbeConfig) -> None:
            super().__init__(config)
            self.lin = torch.nn.Linear(2, 2)

        def prepare_inputs_for_generation(self, ids, **kw):  # type: ignore[no-untyped-def]
            return {"ids": ids}

    class Encoder(PreTrainedModel):
        config_class = ProbeConfig

        def __init__(self, config: ProbeConfig) -> None:
            super().__init__(config)
            self.lin = torch.nn.Linear(2, 2)

    lm = build_model(Lm, {}, tmp_path)
    assert hasattr(lm, "generate") and isinstance(lm, Lm) and type(lm).__name__ == "Lm"
    assert not hasattr(build_model(Encoder, {}, tmp_path), "generate")


def test_a_legacy_tuple_cache_reader_is_capped_below_454_and_a_repacked_checkpoint_runs_on_the_last_4x(
        tmp_path: Path) -> None:
    """``past_key_values[0][0].size(-2)`` with no ``_supports_cache_class``: from 4.54 generate hands every model
    an empty DynamicCache at its first step, so a checkpoint re-saved with 4.55 (a quantized repack) must not
    pick 4.55 for code written before it; declaring cache-class support is no coupling."""
    legacy = textwrap.dedent('''\
        from transformers import PreTrainedModel


        class OldModel(PreTrainedModel):
            def forward(self, input_ids, past_key_values=None):
                past_length = 0 if past_key_values is None else past_key_values[0][0].size(-2)
                return past_length
    ''')
    found = [c for c in couplings(legacy) if c.rule == "legacy-cache-default"]
    assert len(found) == 1 and found[0].before == "4.54" and found[0].line == 6
    assert "empty DynamicCache" in found[0].reason
    assert not [c for c in couplings(legacy.replace("    def forward",
                                                    "    _supports_cache_class = True\n\n    def forward"))
                if c.rule == "legacy-cache-default"]
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_m.py").write_text(legacy)
    (model / "config.json").write_text(json.dumps({"transformers_version": "4.55.0", "model_type": "m"}))
    if not (host_version("transformers") or "").startswith("5."):
        pytest.skip("the host's transformers is not 5.x: no era is chosen")
    res = resolve(model, "cpu", None)
    assert res.era == "transformers<4.50"
    assert any("at or past 4.54" in n and "modeling_m.py:6" in n for n in res.notes), res.notes
