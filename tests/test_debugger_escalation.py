"""When no recipe covers a failure (and no change of npuport's is to blame), the debugger under the default
rule policy asks the LLM policy when an LLM is configured, and otherwise stops with a report of what it
tried and the knowledge-base passages it consulted. Only the LLM service is faked (tests/llm_stub.py, a
local OpenAI-compatible HTTP server); the graph, sandbox runs, patcher and validator are real."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.fixing.diagnosis import escalate
from agents.models import Citation, Diagnosis, Frame, StructuredException
from tests.llm_stub import StubLLMServer
from tests.test_llm_policy_e2e import _script, write_planted_model

_EXC = StructuredException(type="RuntimeError", message="npuport-planted: unsupported layout strided",
                           frames=[Frame(file="modeling_planted.py", line=19, in_model=True)])


def _no_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("NPUPORT_LLM_BASE_URL", "NPUPORT_LLM_MODEL", "NPUPORT_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)


def test_without_an_llm_the_step_cites_the_kb_and_says_none_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_llm(monkeypatch)
    diag = Diagnosis(id="diag-1", run_id="run-1", signature="exception:x", kind="exception", summary="boom",
                     citations=[Citation(source="recipe:H1", title="r"),
                                Citation(source="kb:torch_npu/faq.md#3", title="Runtime errors")])
    out, notes = escalate({"request": {"policy": "rule"}}, diag, _EXC, "rule")
    assert out.fix is None and out.params["llm"] == "not configured"
    assert notes[0].startswith("knowledge base for RuntimeError: [kb:torch_npu/faq.md#3] Runtime errors")
    assert "no LLM is configured" in notes[1]
    # the hybrid / llm policies asked their LLM already: the step does not ask again
    assert escalate({"request": {}}, diag, _EXC, "hybrid")[0].params.get("llm") is None


@pytest.fixture()
def llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_llm(monkeypatch)
    monkeypatch.setenv("NPUPORT_LLM_MODEL", "stub-model")
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", "stub-key")
    monkeypatch.setenv("NPUPORT_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("NPUPORT_LLM_TIMEOUT_S", "30")
    monkeypatch.setenv("NPUPORT_SANDBOX", "process")


@pytest.mark.slow
def test_rule_policy_asks_the_llm_when_no_recipe_covers_the_failure(tmp_path: Path, npuport_home: Path,
                                                                   llm_env: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    model = write_planted_model(tmp_path / "planted")
    out = tmp_path / "bundle"
    with StubLLMServer({"debugger": _script()}) as stub:
        monkeypatch.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        state = run_port({"request": {"model_path": str(model), "target": "cpu", "policy": "rule",
                                      "out_dir": str(out)}}, "rule-then-llm")
    assert state["status"] == "validated", state.get("reason")
    assert stub.agents == ["debugger", "debugger"]  # the rule policy's code reader and patcher never ask
    (llm_diag,) = [d for d in state["diagnoses"] if d["params"].get("by") == "llm"]
    assert llm_diag["fix"] == "llm-edit" and llm_diag["run_id"] == "run-1"
    last = state["patches"][-1]
    assert last["codemod"] == "llm-edit" and last["diagnosis_id"] == llm_diag["id"]  # one commit in the history
    assert '+        if layout not in ("packed", "strided"):' in (out / "port.patch").read_text()
    port_runs = [r["ok"] for r in state["runs"] if r["id"].startswith("run-")]
    assert port_runs == [False, True]  # each attempt is a recorded sandbox run
    assert any("asked the LLM policy: llm-edit" in t["summary"] for t in state["trace"])


@pytest.mark.slow
def test_rule_policy_without_an_llm_stops_with_what_it_tried(tmp_path: Path, npuport_home: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    _no_llm(monkeypatch)
    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    state = run_port({"request": {"model_path": str(write_planted_model(tmp_path / "planted")), "target": "cpu",
                                  "policy": "rule", "out_dir": str(tmp_path / "bundle")}}, "rule-no-llm")
    assert state["status"] == "failed"
    reason = state["reason"]
    assert "npuport-planted: unsupported layout" in reason and "no recipe covers" in reason
    assert "Tried: 1 sandbox run(s)" in reason and "LLM: not configured" in reason


def test_a_run_killed_at_its_wall_clock_limit_says_how_to_give_it_more_time() -> None:
    """A timeout has no code fix: the reason says the limit was the user's and how to raise it (twice it),
    instead of "no recipe covers timeout" (the xcomposer family on two loaded cores)."""
    from agents.models import RunRecord, StructuredException
    from agents.nodes.debugger import debugger_node

    rec = RunRecord(id="run-1", purpose="port", target="ascend-sim", ok=False, status="timeout", wall_s=450.0,
                    result_path="r.json", exception=StructuredException(
                        type="Timeout", message="the run exceeded its wall-clock limit of 450 s and was killed"))
    out = debugger_node({"request": {"model_path": "/tmp", "target": "ascend-sim", "run_timeout_s": 450},
                         "runs": [rec.model_dump(mode="json")], "counters": {"port_runs": 1}})
    assert out["status"] == "failed"
    assert "--run-timeout 900" in out["reason"] and "no recipe covers" not in out["reason"], out["reason"]
