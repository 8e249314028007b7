"""Retrieval of real users' errors, one test per miss family of issue #17, on a real Chroma store.

The store holds our recipes and runtime-failure notes plus three CANN operator pages read from
../shared/data/cann-ops-docs (aclnnAdd/aclnnInplaceAdd, aclnnCast, aclnnLog/aclnnInplaceLog) keyed through
op-plugin's tables in ../shared/data/op-plugin. Queries are messages quoted from public issues (their
sources are in bench/kb_eval_real.yaml). The embedding model is the real packaged MiniLM.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from knowledge.errors import KBError
from knowledge.kb import KnowledgeBase
from knowledge.kb.aclnn import aclnn_to_ops, chip_of, parse_aclnn_doc
from knowledge.kb.cli_support import kb_build
from knowledge.kb.dtypes import supported_dtypes
from knowledge.kb.identifiers import extract_keys
from knowledge.kb.lexical import BM25Index, Doc
from knowledge.kb.recipes import recipe_keys_for

OPS = ("math/add/docs/aclnnAdd&aclnnInplaceAdd.md", "math/cast/docs/aclnnCast.md",
       "math/log/docs/aclnnLog&aclnnInplaceLog.md")


@pytest.fixture(scope="module")
def store(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> KnowledgeBase:
    root = tmp_path_factory.mktemp("kbret")
    docs = root / "cann-ops-docs"
    for rel in OPS:
        dst = docs / "ops-math" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_data / "cann-ops-docs" / "ops-math" / rel, dst)  # a temp copy, not in the repo
    kb = KnowledgeBase(root / "home")
    stats = kb.build([f"opplugin:{shared_data / 'op-plugin'}", str(docs)], progress=False)
    assert not stats.skipped and stats.collections["ascend_ops"] >= 6
    return kb


# ---------------------------------------------------------------- identifier extraction (pure)


def test_identifiers_know_ascend_vocabularies_and_not_module_paths() -> None:
    assert extract_keys("import torch_npu.npu failed") == []  # a module, not the op "npu"
    assert extract_keys("build/CMakeFiles/torch_npu.dir/compiler_depend.ts:361") == []  # a CMake folder
    assert extract_keys("torch_npu.npu_rms_norm(x)") == ["op:npu_rms_norm"]
    keys = extract_keys("call aclnnInplaceAdd failed, error code is 161002 EZ1001 ... 507015 报错码EE9999出现")
    assert {"aclnn:aclnninplaceadd", "code:161002", "code:ez1001", "code:507015", "code:ee9999"} <= set(keys)
    assert extract_keys("ImportError: libhccl.so: cannot open shared object file") == ["lib:libhccl.so"]
    assert "api:aclrtsynchronizestream" in extract_keys("AclrtSynchronizeStreamWithTimeout(copy_stream)")
    # ALL-CAPS words are not environment variables; Ascend's variables and assignments are
    assert extract_keys("RuntimeError ERROR WARNING HTTP_PROXY ERR_DEMO") == []
    assert extract_keys("export ASCEND_HOME_PATH=/usr/local/Ascend") == ["env:ASCEND_HOME_PATH"]
    assert extract_keys("disable with TORCH_DEVICE_BACKEND_AUTOLOAD=0") == ["env:TORCH_DEVICE_BACKEND_AUTOLOAD"]
    assert extract_keys("MY_SWITCH=1 python run.py") == ["env:MY_SWITCH"]


def test_stream_sync_failures_do_not_signal_the_host_sync_recipe() -> None:
    for msg in (
        "RuntimeError: ACL stream synchronize failed, error code:507015",
        "NPU function error: c10_npu::acl::AclrtSynchronizeStreamWithTimeout(stream()), error code is 507011",
        "npuSynchronizeDevice: aclrtSynchronizeDevice, error code is 507046",
    ):
        assert "hz:h6" not in recipe_keys_for(msg), msg
    assert "hz:h6" in recipe_keys_for("loss.item() in the loop forces a host sync every step")


# ---------------------------------------------------------------- the CANN operator reference (pure)


def test_aclnn_page_parses_names_products_and_dtypes_per_chip(shared_data: Path) -> None:
    page = shared_data / "cann-ops-docs" / "ops-math" / OPS[0]
    doc = parse_aclnn_doc(page.read_text(encoding="utf-8"), page.name)
    assert doc is not None and doc.names[:2] == ["aclnnAdd", "aclnnInplaceAdd"]
    assert doc.products["910b"] is True and doc.products["310p"] is False
    assert "BFLOAT16" in doc.dtypes("Ascend910B3")["self"]
    assert "BFLOAT16" not in doc.dtypes("Ascend910A")["self"]  # the page's note for Atlas training
    assert "DOUBLE" in doc.dtypes("910A")["self"]
    assert aclnn_to_ops("aclnnInplaceAdd")[0] == "add_" and aclnn_to_ops("aclnnLogSoftmax")[0] == "log_softmax"
    assert (chip_of("Atlas A2 训练系列产品"), chip_of("Ascend310P3"), chip_of("Atlas A3 推理系列产品")) == (
        "910b",
        "310p",
        "A3",
    )


def test_bm25_ranks_rare_shared_words_and_reads_chinese() -> None:
    idx = BM25Index.build(
        [
            Doc("a", "ascend_ops", "NPU out of memory. Tried to allocate more blocks", {"title": "oom"}),
            Doc("b", "ascend_ops", "stream synchronize failed after an earlier kernel", {"title": "sync"}),
            Doc("c", "ascend_ops", "数据类型不支持BFLOAT16", {"title": "zh"}),
        ]
    )
    assert idx.search("Tried to allocate 52.00 MiB", 2)[0][0].id == "a"
    assert idx.search("synchronize stream", 2)[0][0].id == "b"
    assert idx.search("不支持", 2)[0][0].id == "c"


# ---------------------------------------------------------------- one store, one test per family


def _first(kb: KnowledgeBase, q: str) -> str:
    hits = kb.search(q, k=5)
    assert hits, q
    return hits[0].source


def test_aclnn_inplace_dtype_error_finds_the_operator_page(store: KnowledgeBase) -> None:
    q = ("call aclnnInplaceAdd failed, detail:EZ1001: self not implemented for DT_UINT64, should be in dtype "
         "support list")
    hits = store.search(q, k=5)
    assert hits[0].kind == "aclnn" and "aclnn:aclnninplaceadd" in hits[0].primary
    assert "op:add_" in hits[0].primary and "op:add" in hits[0].primary  # aten names via op-plugin
    cast = store.search("RuntimeError: call aclnnCast failed, detail:EZ1001: self not implemented for DT_BFLOAT16")
    assert any("aclnnCast" in h.source for h in cast[:3])  # beside our dtype recipe (H5)


def test_supported_dtypes_for_the_port_report(store: KnowledgeBase) -> None:
    sup = supported_dtypes("aten::add_", "Ascend910A", kb=store)
    assert sup is not None and sup.chip == "910" and sup.supported_on_chip is True
    assert "BFLOAT16" not in sup.dtypes["self"] and "FLOAT16" in sup.dtypes["self"]
    log = supported_dtypes("aclnnInplaceLog", "910A", kb=store)
    assert log is not None and log.supported_on_chip is False and "not supported" in log.summary()
    assert supported_dtypes("aclnnNoSuchOp", "910b", kb=store) is None


def test_stream_sync_failure_is_a_device_failure_not_host_sync(store: KnowledgeBase) -> None:
    q = (
        "RuntimeError: synchronize:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:361 NPU function error: "
        "c10_npu::acl::AclrtSynchronizeStreamWithTimeout(stream()), error code is 507011"
    )
    hits = store.search(q, k=5)
    assert hits[0].source == "facts/stream_sync_failure.md"
    assert all(h.id != "recipe:H6" for h in hits[:1])


def test_out_of_memory(store: KnowledgeBase) -> None:
    q = "RuntimeError: NPU out of memory. Tried to allocate 226.00 MiB (NPU 2; 60.96 GiB total capacity)"
    assert _first(store, q) == "facts/out_of_memory.md"


def test_missing_shared_library_and_env_setup(store: KnowledgeBase) -> None:
    for q in (
        "ImportError: libatb.so: cannot open shared object file: No such file or directory",
        "RuntimeError: Failed to load the backend extension: torch_npu. You can disable extension auto-loading "
        "with TORCH_DEVICE_BACKEND_AUTOLOAD=0.",
    ):
        assert _first(store, q) == "facts/missing_libraries_env.md", q


def test_torch_npu_module_paths_do_not_match_ops(store: KnowledgeBase) -> None:
    hits = store.search("ModuleNotFoundError: No module named 'torch_npu.npu' in CMakeFiles/torch_npu.dir/", k=5)
    assert all("op:npu" not in h.matched and "op:dir" not in h.matched for h in hits)


# ---------------------------------------------------------------- sources a user names


def test_named_sources_fail_loudly_and_git_urls_are_cloned_once(tmp_path: Path, npuport_home: Path) -> None:
    with pytest.raises(KBError, match="not found"):
        kb_build([str(tmp_path / "no-such-folder")], progress=False)
    with pytest.raises(KBError, match="Cannot clone"):
        kb_build([f"git:file://{tmp_path}/no-such-repo"], progress=False)
    repo = tmp_path / "ops-demo"
    (repo / "demo" / "docs").mkdir(parents=True)
    (repo / "demo" / "docs" / "aclnnDemoScale.md").write_text(
        "# aclnnDemoScale\n\n## 功能说明\n\n- 接口功能：demo scaling in our own words.\n", encoding="utf-8"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "demo"], check=True)
    out = kb_build([f"git:file://{repo}"], progress=False, json=True)
    assert isinstance(out, dict) and out["added"] >= 1
    assert list((npuport_home / "cache" / "git").glob("*/demo/docs/aclnnDemoScale.md"))
    hits = KnowledgeBase().search("aclnnDemoScale failed", k=1)
    assert hits and hits[0].kind == "aclnn"
