"""serve.sh from the knowledge base: the model's class from its config and code, the vllm-ascend docs the
KB holds for that class, each setting cited with its doc, documented defaults (said so) without the docs,
and a served folder that holds the weights and tokenizer with the ported code over them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agents.deploy import serve, vllm
from agents.deploy.bundle import serve_plan

# Synthetic configs of the two classes (the names are made up: nothing may depend on them).
MM_CONFIG: dict[str, Any] = {
    "architectures": ["ZetaOcrForCausalLM"], "model_type": "zeta_vl",
    "auto_map": {"AutoConfig": "modeling_zeta.ZetaConfig", "AutoModel": "modeling_zeta.ZetaOcrForCausalLM"},
    "language_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                        "max_position_embeddings": 8192, "n_routed_experts": 8, "n_shared_experts": 1},
    "vision_config": {"image_size": 64, "width": 32}, "projector_config": {"input_dim": 32, "n_embed": 64},
    "torch_dtype": "bfloat16",
}
TEXT_CONFIG: dict[str, Any] = {"architectures": ["PlainLMForCausalLM"], "model_type": "plain_lm", "hidden_size": 64,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
                               "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def _folder(root: Path, config: dict[str, Any], code: str | None) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    if code is not None:
        (root / "modeling_zeta.py").write_text(code)
    return root


def test_model_class_from_config_and_code(tmp_path: Path) -> None:
    mm = serve.model_class(MM_CONFIG, _folder(tmp_path / "mm", MM_CONFIG, "def forward(self, input_ids, images): ..."))
    assert (mm.multimodal, mm.remote_code, mm.moe, mm.max_len) == (True, True, True, 8192)
    assert "vision_config" in mm.why["multimodal"] and "n_routed_experts=8" in mm.why["moe"]
    text = serve.model_class(TEXT_CONFIG, _folder(tmp_path / "text", TEXT_CONFIG, None))
    assert (text.multimodal, text.remote_code, text.moe, text.max_len) == (False, False, False, 4096)
    # Code that takes pixel values makes a model multimodal even when its config says nothing of vision.
    coded = serve.model_class(TEXT_CONFIG, _folder(tmp_path / "coded", TEXT_CONFIG, "def f(pixel_values): ..."))
    assert coded.multimodal and coded.remote_code


def test_serve_script_parser_reads_exports_and_flags() -> None:
    doc = ("text\n```shell\nexport VLLM_USE_V1=1\nexport PYTORCH_NPU_ALLOC_CONF=\"expandable_segments:True\"\n"
           "vllm serve /m \\\n  --trust-remote-code \\\n  --max_model_len 8192 \\\n  --gpu-memory-utilization 0.8 \\\n"
           "  --additional-config '{\n  \"a\": true\n}' \\\n  --mm-processor-cache-gb 0\n```\n")
    env, flags = serve.parse_serve_script(doc) or ({}, {})
    assert env == {"VLLM_USE_V1": "1", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}
    assert flags["trust-remote-code"] is True and flags["max-model-len"] == "8192"
    assert flags["gpu-memory-utilization"] == "0.8" and flags["mm-processor-cache-gb"] == "0"
    assert json.loads(flags["additional-config"]) == {"a": True}
    assert serve.parse_serve_script("no code here") is None


def test_without_the_docs_documented_defaults_are_used_and_said(tmp_path: Path) -> None:
    model = _folder(tmp_path / "mm", MM_CONFIG, "def forward(self, images): ...")
    state = {"request": {"model_path": str(model)}, "entry": {"config": "config.json"}}
    settings, plan = serve_plan(state, model, search=lambda q, k: [])
    assert "documented defaults are used" in plan.note
    # ... and what the docs would have given a model of this class (multimodal, MoE, remote code)
    assert "VLLM_ASCEND_ENABLE_NZ" in plan.note and "--mm-processor-cache-gb" in plan.note
    assert "--no-enable-prefix-caching" in plan.note and "--additional-config" in plan.note
    by = {s.name: s for s in settings}
    assert by["gpu-memory-utilization"].source == "documented default"
    assert by["PYTORCH_NPU_ALLOC_CONF"].citation.startswith("documented default")
    assert by["trust-remote-code"].value is True and by["max-model-len"].value == 8192


@pytest.fixture(scope="module")
def vllm_docs_kb(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real knowledge base (Chroma + the packaged embedding model) built from the vllm-ascend docs."""
    from knowledge.kb import KnowledgeBase

    home = tmp_path_factory.mktemp("kb-home")
    kb = KnowledgeBase(home)
    kb.build([str(shared_data / "vllm-ascend-docs")], progress=False)
    assert kb.counts().get("serving"), "the vllm-ascend docs did not go to the serving collection"
    return kb


def _script(kb: Any, model: Path, out: Path) -> tuple[dict[str, vllm.ServeSetting], str, str, serve.ServePlan]:
    state = {"request": {"model_path": str(model)}, "entry": {"config": "config.json"}}
    settings, plan = serve_plan(state, model, search=lambda q, k: kb.search(q, k=k, collections=["serving"]))
    out.mkdir(parents=True, exist_ok=True)
    sh = vllm.render_serve_sh(settings, model.name, str(model))
    env = vllm.render_set_env_sh(settings)
    for name, text in (("serve.sh", sh), ("set_env.sh", env)):
        (out / name).write_text(text)
        assert subprocess.run(["bash", "-n", str(out / name)]).returncode == 0
    return {s.name: s for s in settings}, sh, env, plan


@pytest.mark.slow
def test_serve_sh_follows_the_docs_for_the_model_class(vllm_docs_kb: Any, tmp_path: Path, shared_data: Path) -> None:
    mm_dir = _folder(tmp_path / "zeta", MM_CONFIG, "def forward(self, input_ids, images): ...")
    text_dir = _folder(tmp_path / "plain", TEXT_CONFIG, None)
    mm, mm_sh, mm_env, mm_plan = _script(vllm_docs_kb, mm_dir, tmp_path / "b1")
    tx, tx_sh, tx_env, tx_plan = _script(vllm_docs_kb, text_dir, tmp_path / "b2")

    # Every KB setting names the doc it came from, and its value is what that doc's serve script says.
    for by in (mm, tx):
        kb_settings = [s for s in by.values() if s.source == "knowledge base"]
        assert kb_settings
        for s in kb_settings:
            doc = s.citation.split(" (KB chunk")[0]
            assert doc.startswith("vllm-ascend-docs/") and "KB chunk" in s.citation
            env, flags = serve.parse_serve_script((shared_data / doc).read_text()) or ({}, {})
            if s.kind == "env":
                assert env.get(s.name) == str(s.value) or f"{s.name}={s.value}" in (shared_data / doc).read_text()
            elif s.kind == "additional_config":
                assert json.loads(flags["additional-config"])[s.name] == s.value, (s.name, doc)
            elif s.name != "max-model-len":
                assert flags.get(s.name) == (True if s.value is True else str(s.value)), (s.name, doc)

    # The multimodal remote-code MoE model is served as the multimodal docs say ...
    assert "--mm-processor-cache-gb 0" in mm_sh and "--trust-remote-code" in mm_sh
    assert "--no-enable-prefix-caching" in mm_sh and "--max-model-len 8192" in mm_sh
    assert "export VLLM_USE_V1=1" in mm_env and "export VLLM_ASCEND_ENABLE_NZ=0" in mm_env
    assert "export TASK_QUEUE_ENABLE=1" in mm_env and "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in mm_env
    assert mm["gpu-memory-utilization"].source == "knowledge base"
    assert "multimodal" in mm_plan.note
    # ... and the plain text model without the multimodal and remote-code settings.
    assert "--mm-processor-cache-gb" not in tx_sh and "--trust-remote-code" not in tx_sh
    assert "--max-model-len 4096" in tx_sh
    assert "text-only" in tx_plan.note
    assert {"mm-processor-cache-gb", "trust-remote-code"} <= set(mm) - set(tx)


def test_serve_sh_serves_the_original_files_with_the_patched_code(tmp_path: Path) -> None:
    """serve.sh run with a stand-in `vllm` (no NPU here): the folder it serves has the weights and
    tokenizer of the original and the ported code, and the original folder is left as it was."""
    original = _folder(tmp_path / "orig", MM_CONFIG, "ORIGINAL = True\n")
    (original / "model.safetensors").write_bytes(b"weights")
    (original / "tokenizer.json").write_text("{}")
    (original / "sub").mkdir()
    (original / "sub" / "helper.py").write_text("ORIGINAL = True\n")
    before = sorted((p.relative_to(original).as_posix(), p.read_bytes()) for p in original.rglob("*") if p.is_file())
    bundle = tmp_path / "bundle"
    (bundle / "patched" / "sub").mkdir(parents=True)
    (bundle / "patched" / "modeling_zeta.py").write_text("PATCHED = True\n")
    (bundle / "patched" / "sub" / "helper.py").write_text("PATCHED = True\n")
    (bundle / "patched" / "config.json").write_text(json.dumps(MM_CONFIG))
    settings, _ = serve_plan({"request": {"model_path": str(original)}, "entry": {}}, bundle / "patched",
                             search=lambda q, k: [])
    (bundle / "serve.sh").write_text(vllm.render_serve_sh(settings, "zeta", str(original)))
    (bundle / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "vllm").write_text('#!/usr/bin/env bash\necho "ARGS $*"\necho "TQ $TASK_QUEUE_ENABLE"\n'
                               'for f in model.safetensors tokenizer.json modeling_zeta.py sub/helper.py; do\n'
                               '  echo "FILE $f $(cat "$2/$f")"; done\n')
    os.chmod(fake / "vllm", 0o755)
    os.chmod(bundle / "serve.sh", 0o755)
    r = subprocess.run([str(bundle / "serve.sh")], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    served = bundle / "serve_model"
    assert f"ARGS serve {served}" in out and "--trust-remote-code" in out
    assert "FILE model.safetensors weights" in out and "FILE tokenizer.json {}" in out
    assert "FILE modeling_zeta.py PATCHED = True" in out and "FILE sub/helper.py PATCHED = True" in out
    after = sorted((p.relative_to(original).as_posix(), p.read_bytes()) for p in original.rglob("*") if p.is_file())
    assert after == before  # the user's folder is never written
    # The original folder missing: a clear message, not a half-built overlay.
    r = subprocess.run([str(bundle / "serve.sh"), str(tmp_path / "nowhere")], capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, timeout=60)
    assert r.returncode == 2 and "original model folder" in r.stderr
    # A served folder inside the original would write into it: refused.
    r = subprocess.run([str(bundle / "serve.sh"), str(original), str(original / "served")], capture_output=True,
                       text=True, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, timeout=60)
    assert r.returncode == 2 and "outside" in r.stderr and not (original / "served").exists()


@pytest.mark.slow
def test_the_knowledge_base_carries_the_known_bad_serving_stacks(vllm_docs_kb: Any) -> None:
    """Every build indexes npuport's note on known-bad vllm-ascend releases; the stack reads it from there."""
    from agents.deploy import stack
    from agents.environment.compat import load_compat

    got = stack.choose_stack(load_compat(), lambda q, k: vllm_docs_kb.search(q, k=k, collections=["ascend_ops"]), None)
    assert got["known_bad_from"] == "the knowledge base", got
    assert [s["vllm_ascend"] for s in got["skipped"]] == ["0.22.1rc1"] and got["chosen"]["vllm_ascend"] == "0.23.0"
