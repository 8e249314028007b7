"""Knowledge base, fast parts: identifiers, chunking, decoding, recipes, wheel-docs and matrix readers.

No Chroma and no embedding model here; tests/test_kb_store.py covers those.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from knowledge.kb import get_recipe, load_recipes
from knowledge.kb.chunking import decode, detect_language, looks_binary, sections_for
from knowledge.kb.identifiers import extract_keys
from knowledge.kb.matrix_chunks import matrix_chunks
from knowledge.kb.recipes import SECTIONS, recipe_keys_for
from knowledge.kb.sources import parse_op_plugin_docs, resolve

REPO = Path(__file__).resolve().parents[1]


def test_identifiers_cover_ops_codes_envs_and_hazards() -> None:
    q = (
        "call aclnnMatmul failed EZ1001 (error code is 161002) for aten::logit.out via torch_npu.npu_rms_norm "
        "and npu_fusion_attention; TORCH_NPU_FALLBACK_CPU_DISABLE=1 ERR01007 see H7 and torch.linalg.lstsq"
    )
    keys = extract_keys(q, hazards=True)
    for k in [
        "aclnn:aclnnmatmul",
        "code:ez1001",
        "code:161002",
        "op:logit",
        "op:npu_rms_norm",
        "op:npu_fusion_attention",
        "env:TORCH_NPU_FALLBACK_CPU_DISABLE",
        "code:err01007",
        "hz:h7",
        "op:linalg_lstsq",
    ]:
        assert k in keys, k


def test_identifiers_skip_modules_dtypes_and_dtype_codes() -> None:
    keys = extract_keys("torch.cuda.synchronize() torch.float16 DT_DOUBLE Tensor.mH H7")
    assert keys == []  # no hazards unless asked; modules, dtypes and DT_* are not identifiers


def test_markdown_sections_respect_code_fences_and_merge_small_ones() -> None:
    text = "\n".join(
        [
            "# torch_npu.npu_demo_op",
            "",
            "## Function",
            "Fuses a demo computation.",
            "",
            "## Prototype",
            "```python",
            "# not a heading",
            "torch_npu.npu_demo_op(x) -> Tensor",
            "```",
            "",
            "## Constraints",
            "x must be float16 or bfloat16. " * 40,
        ]
    )
    secs = sections_for(text, "demo")
    assert secs, "expected sections"
    assert all("not a heading" not in s.title for s in secs)
    assert any("# not a heading" in s.body for s in secs)  # the comment stayed inside its code block
    assert all(s.primary == ["op:npu_demo_op"] for s in secs)  # every chunk knows its op
    assert len(secs) == 2  # small Function + Prototype merged; long Constraints on its own


def test_api_support_list_compacts_entries() -> None:
    # Shape of a native-API support page, in our own words.
    entry = (
        "### torch.{n}\n\n**原生文档**：[torch.{n}](https://pytorch.org/docs/2.13/generated/torch.{n}.html)\n\n"
        "**支持情况**：\n\n| 硬件 | 是否支持 |\n| ---- | :----: |\n| <term>Atlas A2 训练系列产品</term> | ✔ |\n"
        "| <term>Ascend 950DT</term> | {mark} |\n{limit}\n"
    )
    text = "# torch\n\n## Math operations\n\n" + "\n".join(
        [
            entry.format(n="abs", mark="✔", limit=""),
            entry.format(n="isneginf", mark="✘", limit=""),
            entry.format(n="lerp", mark="✔", limit="**限制与说明**： `weight` only float32 here\n"),
        ]
    )
    secs = sections_for(text, "torch")
    lerp = [s for s in secs if s.primary == ["op:lerp"]]
    assert len(lerp) == 1 and "Limits: `weight` only float32" in lerp[0].body
    group = [s for s in secs if "without limits" in s.title]
    assert len(group) == 1 and {"op:abs", "op:isneginf"} <= set(group[0].primary)
    assert "torch.isneginf (not on Ascend 950DT)" in group[0].body


def test_decode_and_language_and_binary() -> None:
    zh = "算子不支持双精度。" * 5
    gb = decode(zh.encode("gb18030"))
    assert gb.text == zh and "GB18030" in gb.note
    bad = decode(b"ok \xff\xfe\xfa end")
    assert bad.text.startswith("ok") and bad.note
    assert decode(b"plain").note == ""
    assert detect_language(zh) == "zh" and detect_language("The operator falls back to CPU.") == "en"
    assert looks_binary(b"abc\x00def") and not looks_binary("文本".encode())


def test_every_hazard_has_a_complete_recipe() -> None:
    recipes = load_recipes()
    # one recipe per registered hazard class, in the registry's order
    from agents.rules.registry import DEFAULT

    assert [r.hazard for r in recipes] == [rule.hazard for rule in DEFAULT.rules]
    for r in recipes:
        assert r.id == f"recipe:{r.hazard}"
        for field in SECTIONS:
            assert len(getattr(r, field)) > 80, (r.hazard, field)
    assert get_recipe("recipe:H7").hazard == "H7"


@pytest.mark.parametrize(
    ("message", "hazard"),
    [
        ("CAUTION: The operator 'aten::isneginf' is not currently supported on the NPU backend", "h7"),
        ("AssertionError: Torch not compiled with CUDA enabled", "h1"),
        ("Distributed package doesn't have NCCL built in", "h9"),
        ("Expected all tensors to be on the same device, but found at least two devices", "h11"),
    ],
)
def test_recipe_signals_match_real_messages(message: str, hazard: str) -> None:
    assert f"hz:{hazard}" in recipe_keys_for(message)


def test_op_plugin_docs_are_read_as_text_not_imported() -> None:
    src = (
        'import torch_npu\n_add_torch_npu_docstr(\n    "npu_demo",\n    """\ntorch_npu.npu_demo(x) -> Tensor\n'
        'Demo op.\n"""\n)\n_add_torch_npu_docstr("npu_other", """Other.""")\n'
    )
    docs = parse_op_plugin_docs(src)
    assert [d.name for d in docs] == ["npu_demo", "npu_other"]
    assert "Demo op." in docs[0].doc


def test_wheel_source_reads_docs_member(tmp_path: Path) -> None:
    whl = tmp_path / "torch_npu-9.9.9-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(
            "torch_npu/_op_plugin_docs.py",
            '_add_torch_npu_docstr("npu_x", """torch_npu.npu_x(a)\nText.""")\n',
        )
    res = resolve([f"wheel:{whl}"])
    assert len(res.units) == 1
    chunks, _ = res.units[0].load()
    assert chunks[0].title == "torch_npu.npu_x" and chunks[0].version == "9.9.9"
    assert chunks[0].primary == ["op:npu_x"]


def test_matrix_records_are_short_facts() -> None:
    matrix = {
        "schema": 1,
        "torch_npu_version": "2.13.0",
        "ops": {
            "add.Tensor": {"npu": True, "kernel": "op_api", "exec": "aclnnAdd", "dtypes": None},
            "add.Scalar": {"npu": True, "kernel": "op_api", "exec": "aclnnAdds"},
        },
        "fallback_ops": ["isneginf", "isneginf.out"],
        "custom_ops": ["npu_rms_norm"],
    }
    chunks = {c.anchor: c for c in matrix_chunks(matrix, "matrix:x", "x.json")}
    assert set(chunks) == {"add", "isneginf", "npu_rms_norm"}  # overloads share one record
    assert "aclnn:aclnnadd" in chunks["add"].keys and "aclnn:aclnnadds" in chunks["add"].keys
    assert "no NPU kernel" in chunks["isneginf"].text and "op:isneginf" in chunks["isneginf"].primary


def test_bad_sources_are_skipped_with_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").mkdir()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bin.md").write_bytes(b"\x00\x01binary")
    (docs / "big.md").write_text("x" * 5000)
    (docs / "ok.md").write_text("# ok\n\ntext " * 10)
    monkeypatch.setenv("NPUPORT_KB_MAX_FILE_BYTES", "4000")  # read when the sources are resolved
    res = resolve([str(tmp_path / "empty"), str(docs), str(tmp_path / "missing")])
    reasons = {Path(s.path).name: s.reason for s in res.skipped}
    assert reasons["bin.md"] == "binary content"
    assert reasons["big.md"].startswith("too large")
    assert reasons["missing"] == "not found"
    assert any("empty" in n for n in res.notes)
    assert [Path(u.path).name for u in res.units] == ["ok.md"]


def test_import_is_light() -> None:
    code = (
        "import sys, knowledge.kb, knowledge.kb.cli_support; "
        "bad = [m for m in ('chromadb', 'torch', 'sentence_transformers', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
