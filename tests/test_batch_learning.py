"""Shared learning in a batch: what one port learns goes into the port memory (knowledge/port_memory.py,
writes serialized across processes) and later ports reuse it without the LLM.

Only the LLM service is faked (tests/llm_stub.py: a scripted OpenAI-compatible server on 127.0.0.1,
talked to by the real ChatOpenAI client); the batch, Ray, the graph, the sandbox runs, the patcher and
the validator are real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.test_llm_policy_e2e import PLANTED, REPLACE, SEARCH, _graph_script, write_planted_model

pytestmark = [pytest.mark.usefixtures("one_ray_at_a_time")]  # tests/conftest.py

FAILURE = "npuport-planted: unsupported layout strided"


def write_sibling(root: Path) -> Path:
    """Another model with the same failure: its own file name, class layout offsets and vocabulary (a
    family that copied the same layout check), so a learned fix must be found by its code."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "npuport.yaml").write_text("name: sibling\nentry:\n  class: modeling_sibling:PlantedLM\n"
                                       "config: config.json\ninputs: modeling_sibling:make_inputs\n"
                                       "run:\n  method: generate\n  kwargs: {max_new_tokens: 4}\n")
    (root / "config.json").write_text(json.dumps({"vocab": 48}))
    (root / "modeling_sibling.py").write_text("# a sibling of planted: the same layout check\n\n\n" + PLANTED)
    return root


@pytest.mark.slow
def _batch(tmp_path: Path, npuport_home: Path, name: str, models: list[str], stub_url: str) -> tuple[Any, Path]:
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(f"name: {name}\ndefaults:\n  target: cpu\n  policy: hybrid\n"
                        "  budget: {max_runs: 4, run_timeout_s: 120}\n  timeout_s: 400\n"
                        "models:\n" + "".join(f"  - path: {m}\n" for m in models))
    out = tmp_path / f"out-{name}"
    env = dict(os.environ, NPUPORT_HOME=str(npuport_home), COLUMNS="200", NPUPORT_LLM_BASE_URL=stub_url,
               NPUPORT_LLM_MODEL="stub-model", NPUPORT_LLM_API_KEY="stub-key", NPUPORT_LLM_MAX_RETRIES="0",
               NPUPORT_LLM_TIMEOUT_S="30")
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-m", "api.cli", "batch", str(manifest), "--workers", "1",
                        "--out", str(out)], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, out


def test_second_port_reuses_what_the_first_learned_without_the_llm(tmp_path: Path, npuport_home: Path) -> None:
    """alpha's LLM edit is journalled as a candidate; once a person reviewed it (`npuport kb review`), beta, with
    the same failure, applies it before its first run: no LLM call, one sandbox run fewer. (Unreviewed, an LLM's
    edit, written from the text the model printed, is reused by no port: tests/security/test_sharing.py.)"""
    pytest.importorskip("ray", reason="the batch extra is not installed: pip install 'npuport[batch]'")
    from knowledge.port_memory import read_records
    from tests.llm_stub import StubLLMServer

    write_planted_model(tmp_path / "alpha")
    write_sibling(tmp_path / "beta")
    with StubLLMServer(_graph_script()) as stub:  # answers alpha's debugger (two turns), and 500 after that
        _, out_a = _batch(tmp_path, npuport_home, "alpha-batch", ["alpha"], stub.base_url)
        learned = [rec for rec in read_records(npuport_home) if rec.get("fix")]
        assert len(learned) == 1 and learned[0]["model"] == "alpha", learned
        rid = learned[0]["id"]
        review = subprocess.run([sys.executable, "-m", "api.cli", "kb", "review", rid], capture_output=True, text=True,
                                env=dict(os.environ, NPUPORT_HOME=str(npuport_home)), cwd=REPO_ROOT, timeout=120)
        assert review.returncode == 0 and "reviewed" in review.stdout, review.stdout + review.stderr
        r, out_b = _batch(tmp_path, npuport_home, "beta-batch", ["beta"], stub.base_url)
    alpha = json.loads((out_a / "results.json").read_text())["ports"][0]
    beta = json.loads((out_b / "results.json").read_text())["ports"][0]
    assert alpha["verdict"] == beta["verdict"] == "validated", (alpha, beta)
    # alpha: the failure no recipe covers, the LLM's fix (two exchanges), the fixed run; beta: no LLM call,
    # the learned edit applied before its first run, so one port run instead of two
    assert stub.agents == ["debugger", "debugger"], stub.agents
    assert (alpha["llm_calls"], beta["llm_calls"]) == (2, 0)
    assert beta["sandbox_runs"] == alpha["sandbox_runs"] - 1, (alpha, beta)  # the reference run and one port run
    alpha_state = json.loads((out_a / "alpha" / "report.json").read_text())
    beta_report = json.loads((out_b / "beta" / "report.json").read_text())
    assert alpha_state["request"]["policy"] == beta_report["request"]["policy"] == "hybrid"
    # what alpha learned is one port-memory record with the edit and the location-free failure
    assert learned[0]["failure_key"] == f"RuntimeError: {FAILURE}"
    assert learned[0]["fix"]["params"]["edits"] == [{"file": "modeling_planted.py", "search": SEARCH,
                                                     "replace": REPLACE}]
    assert alpha["learned"] == [rid] and alpha["reused"] == []
    assert beta["reused"] == [f"{rid} (from earlier)"] and beta["learned"] == []  # learned by an earlier batch
    # beta's bundle: the learned edit, moved onto beta's own file, as a commit that cites the record
    patch = (out_b / "beta" / "port.patch").read_text()
    assert "+++ b/modeling_sibling.py" in patch and '+        if layout not in ("packed", "strided"):' in patch
    assert f"- alpha learned: {rid}" in (out_a / "report.md").read_text()
    md = (out_b / "report.md").read_text()
    assert f"- beta reused: {rid} (from earlier)" in md, md
    assert f"RuntimeError: {FAILURE}" in md
    assert f"beta reused: {rid}" in r.stdout


def _recorded(state: dict[str, Any]) -> dict[str, Any]:
    """A final state with its runs, diagnoses and patches completed as the nodes write them (RunRecord,
    Diagnosis, Patch: the fields these tests leave out, filled)."""
    run = {"purpose": "port", "target": "cpu", "ok": False, "status": "error", "wall_s": 1.0, "result_path": ""}
    defaults = {"runs": run, "diagnoses": {"kind": "exception", "summary": "it failed"}, "patches": {"commit": ""}}
    return {**state, **{name: [{**fill, **r} for r in state.get(name) or []] for name, fill in defaults.items()}}


def _port_state(tmp_path: Path, model: Path, target: str = "cpu") -> tuple[dict[str, object], object]:
    from agents.workspace import Workspace

    ws = Workspace.create(model, tmp_path / "work" / model.name)
    return {"workdir": str(ws.root), "target": {"name": target}, "request": {"model_path": str(model)}}, ws


def _learn_from_alpha(home: Path) -> str:
    """The record a validated alpha port journals (agents/reading/citations.py), from a minimal final state, then
    reviewed (an LLM's edit is reused by no port before: tests/security/test_sharing.py)."""
    from agents.reading.citations import _journal_learned
    from knowledge.locks import home_lock
    from knowledge.port_memory import WRITE_LOCK

    state = _recorded({"request": {"model_path": "/m/alpha"}, "target": {"name": "cpu"},
             "runs": [{"id": "run-1", "exception": {"type": "RuntimeError", "message": FAILURE}}],
             "diagnoses": [{"id": "diag-1", "run_id": "run-1", "signature": "exception:RuntimeError@m.py:9",
                            "fix": "llm-edit", "file": "modeling_planted.py",
                            "params": {"by": "llm", "llm_tokens": 240, "prompt_id": "002-debugger",
                                       "edits": [{"file": "modeling_planted.py", "search": SEARCH,
                                                  "replace": REPLACE}]}}],
             "patches": [{"id": "patch-2", "diagnosis_id": "diag-1", "summary": "LLM llm-edit: accept both layouts",
                          "files": ["modeling_planted.py"]},
                         {"id": "patch-1", "summary": "H1 device-agnostic", "finding_ids": ["f1"]}]})
    from knowledge.port_memory import review_record

    with home_lock(WRITE_LOCK):
        ids = _journal_learned(state)
        assert _journal_learned(state) == ids  # the same fix twice is one record
        assert len(ids) == 1
        review_record(ids[0], "operator", home)  # an LLM's edit is reused once a person reviewed it
    return ids[0]


def test_learned_fix_is_found_by_code_and_failure_not_by_file_names(tmp_path: Path, npuport_home: Path) -> None:
    """Fast: the journal record, the static reuse (learned_actions) and the debugger's reuse
    (learned_diagnosis), on real workspaces; a model without that code, or another target, gets nothing."""
    from agents.fixing.learned import learned_actions, learned_diagnosis
    from agents.models import Diagnosis, Frame, StructuredException
    from knowledge.port_memory import read_records

    rid = _learn_from_alpha(npuport_home)
    assert [r["id"] for r in read_records(npuport_home)] == [rid]
    state, ws = _port_state(tmp_path, write_sibling(tmp_path / "beta"))
    actions = learned_actions(state, ws)  # type: ignore[arg-type]
    assert len(actions) == 1 and actions[0].files == ["modeling_sibling.py"]
    assert actions[0].params["edits"][0]["file"] == "modeling_sibling.py"
    assert [c.source for c in actions[0].citations] == [rid]
    assert learned_actions({**state, "target": {"name": "ascend-sim"}}, ws) == []  # type: ignore[arg-type]
    from tests.tiny_models import write_tiny_model

    other_state, other_ws = _port_state(tmp_path, write_tiny_model(tmp_path / "tiny"))
    assert learned_actions(other_state, other_ws) == []  # type: ignore[arg-type]

    # after a failure: the same failure (another file and line, another target) finds the learned fix
    exc = StructuredException(type="RuntimeError", message=FAILURE, frames=[
        Frame(file="modeling_sibling.py", line=24, func="generate", code="raise RuntimeError(...)", in_model=True)])
    diag = learned_diagnosis({**state, "target": {"name": "ascend-sim"}}, "run-1", exc, [])
    assert diag is not None and diag.fix == "llm-edit" and diag.file == "modeling_sibling.py"
    assert [c.source for c in diag.citations] == [rid] and "alpha" in diag.summary
    assert learned_diagnosis(state, "run-2", exc, [diag]) is None  # tried once here: not again (loop)
    other = exc.model_copy(update={"message": "something else entirely"})
    assert learned_diagnosis(state, "run-1", other, []) is None
    assert learned_diagnosis(other_state, "run-1", exc, [Diagnosis(id="d", run_id="r", signature="s", kind="k",
                                                                   summary="")]) is None  # no such code there


def test_port_memory_appends_are_serialized_across_processes(npuport_home: Path) -> None:
    """Concurrent ports append to one journal under the knowledge-base lock: every record once, no torn line."""
    code = ("import sys\nfrom knowledge.locks import home_lock\n"
            "from knowledge.port_memory import WRITE_LOCK, append_record\n"
            "for i in range(40):\n"
            "    with home_lock(WRITE_LOCK):\n"
            "        append_record({'id': f'memory:{sys.argv[1]}-{i}', 'signature': 's', 'pad': 'x' * 5000})\n"
            "        append_record({'id': 'memory:shared', 'signature': 's'})\n")
    env = dict(os.environ, NPUPORT_HOME=str(npuport_home))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], cwd=REPO_ROOT, env=env) for n in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    from knowledge.port_memory import journal_path, read_records

    lines = journal_path(npuport_home).read_text().splitlines()
    assert all(json.loads(line)["id"] for line in lines)  # no torn or interleaved line
    ids = [r["id"] for r in read_records(npuport_home)]
    assert len(ids) == len(set(ids)) == 3 * 40 + 1


@pytest.mark.slow
def test_learned_fix_goes_into_the_knowledge_base_store(tmp_path: Path, npuport_home: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With a Chroma store (real, MiniLM embeddings), the validated port's learned fix is journalled once,
    with its edit, and indexed under the same id: a search for the failure finds it as port memory."""
    import agents.reading.citations as citations
    from knowledge.kb import KnowledgeBase
    from knowledge.port_memory import read_records

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "layouts.md").write_text("# Layouts\n\nTensors are stored strided unless packed.\n")
    KnowledgeBase().build([str(docs)], progress=False)
    monkeypatch.setattr(citations, "_kb", None)  # the module caches one per process: this test's home
    monkeypatch.setattr(citations, "_failed", "")
    state = _recorded({"request": {"model_path": "/m/alpha"}, "target": {"name": "cpu"},
             "runs": [{"id": "run-1", "exception": {"type": "RuntimeError", "message": FAILURE}}],
             "diagnoses": [{"id": "diag-1", "run_id": "run-1", "signature": "exception:RuntimeError@m.py:9",
                            "fix": "llm-edit", "file": "modeling_planted.py",
                            "params": {"by": "llm", "edits": [{"file": "modeling_planted.py", "search": SEARCH,
                                                               "replace": REPLACE}]}}],
             "patches": [{"id": "patch-1", "diagnosis_id": "diag-1", "summary": "LLM llm-edit: accept both layouts",
                          "files": ["modeling_planted.py"]}]})
    ids = citations.record_validated_fixes(state)
    assert len(ids) == 1
    records = read_records(npuport_home)
    assert [r["id"] for r in records] == ids and records[0]["fix"]["codemod"] == "llm-edit"
    hits = KnowledgeBase().search(f"RuntimeError: {FAILURE}", k=3)
    assert hits and hits[0].id == ids[0] and hits[0].match == "memory", hits


def test_only_llm_fixes_the_port_kept_are_learned(npuport_home: Path) -> None:
    """A recipe's fix is not journalled as learned (the recipe covers it already), nor an LLM fix that
    the debugger undid later (revert-and-retry): the port did not validate with it."""
    from agents.reading.citations import _journal_learned
    from knowledge.port_memory import read_records

    edits = [{"file": "m.py", "search": SEARCH, "replace": REPLACE}]
    state = _recorded({"request": {"model_path": "/m/alpha"}, "target": {"name": "cpu"},
             "runs": [{"id": "run-1", "exception": {"type": "RuntimeError", "message": FAILURE}},
                      {"id": "run-2", "exception": {"type": "NameError", "message": "name 'x' is not defined"}}],
             "diagnoses": [{"id": "diag-1", "run_id": "run-1", "signature": "s1", "fix": "llm-edit",
                            "params": {"by": "llm", "edits": edits}},
                           {"id": "diag-2", "run_id": "run-2", "signature": "s2", "fix": "revert-npuport-change",
                            "params": {"commit": "c1"}},
                           {"id": "diag-3", "run_id": "run-2", "signature": "s3", "fix": "device-agnostic",
                            "params": {}}],
             "patches": [{"id": "patch-1", "commit": "c1", "diagnosis_id": "diag-1", "summary": "llm"},
                         {"id": "patch-2", "commit": "c2", "diagnosis_id": "diag-2", "summary": "revert",
                          "codemod": "revert-npuport-change"},
                         {"id": "patch-3", "commit": "c3", "diagnosis_id": "diag-3", "summary": "recipe"}]})
    assert _journal_learned(state) == [] and read_records(npuport_home) == []
    state["patches"] = [state["patches"][0], state["patches"][2]]  # nothing undone: the LLM fix is learned
    assert len(_journal_learned(state)) == 1 and read_records(npuport_home)[0]["fix"]["codemod"] == "llm-edit"
