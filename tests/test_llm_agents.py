"""The five LLM agent paths (planner, code-reader, patcher, debugger, tuner) and `npuport doctor`,
each against a REAL local OpenAI-compatible HTTP server (tests/llm_stub.StubLLMServer on 127.0.0.1)
reached by the real langchain-openai client. Only the LLM service is faked; nodes, workspace, scanner,
search and records are real. Covers malformed JSON, an edit that does not apply, HTTP 429, a timeout
and a spent budget, each of which falls back to the rules and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.llm_stub import StubLLMServer, delayed, http_error, malformed_tool_call, tool_call_reply
from tests.test_llm_policy_e2e import write_planted_model

SECRET = "sk-abcdefghijklmnop1234"


@pytest.fixture()
def llm_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for k in ("NPUPORT_LLM_BASE_URL", "NPUPORT_LLM_MODEL", "NPUPORT_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NPUPORT_LLM_MODEL", "stub-model")
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", "stub-key-0123456789")
    monkeypatch.setenv("NPUPORT_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("NPUPORT_LLM_TIMEOUT_S", "20")
    return monkeypatch


# --------------------------------------------------------------------------------------------- doctor


@pytest.mark.slow  # starts the stub LLM server
def test_doctor_shows_the_endpoint_with_the_key_masked_and_checks_that_it_answers(llm_env: pytest.MonkeyPatch) -> None:
    from api.cli import app

    runner = CliRunner()
    with StubLLMServer([tool_call_reply("x", {})], models=["stub-model"]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ok"] and data["settings"]["api_key"] == "****6789" and "stub-key-0123456789" not in res.output
    assert [p["ok"] for p in data["probes"]] == [True, True] and "stub-model listed" in data["probes"][0]["detail"]
    assert stub.paths == ["/v1/models", "/v1/chat/completions"]
    assert stub.requests[0]["max_tokens"] == 1
    # An endpoint that lists other models and refuses the chat: exit 1, the HTTP status and body said.
    with StubLLMServer([http_error(401, "bad key")], models=["other-model"]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 1, res.output
    models, chat = json.loads(res.output)["probes"]
    assert models["ok"] and models["detail"] == "1 model(s); stub-model not listed"
    assert not chat["ok"] and chat["detail"].startswith("HTTP 401: ") and "bad key" in chat["detail"]
    # The same endpoint, gone: exit 1 and the reason.
    llm_env.setenv("NPUPORT_LLM_TIMEOUT_S", "2")
    res = runner.invoke(app, ["doctor"])
    assert res.exit_code == 1 and "FAIL" in res.output, res.output
    # Nothing configured: the rules do everything, which is not an error.
    llm_env.delenv("NPUPORT_LLM_MODEL")
    res = runner.invoke(app, ["doctor"])
    assert res.exit_code == 0 and "no LLM is configured" in res.output


# -------------------------------------------------------------------------------------------- planner

GOAL_ANSWER = {"target": "ascend-sim", "chip": "910b", "objective": "latency", "constraints": ["dtype=bf16"],
               "tune": False}


def _planner_state(model: Path, policy: str = "hybrid") -> dict[str, Any]:
    # Wording the rule parser does not understand: it would keep the default objective (throughput).
    return {"goal": f"get {model} onto a 910B2 (the emulated one), what matters is how fast each single "
                    "reply comes back, keep bf16", "request": {"policy": policy}}


@pytest.mark.slow  # starts the stub LLM server
def test_planner_turns_a_free_form_goal_into_a_typed_plan_through_the_llm(tmp_path: Path,
                                                                          llm_env: pytest.MonkeyPatch) -> None:
    from agents.nodes.planner import planner_node

    model = write_planted_model(tmp_path / "m")
    # The first answer is malformed JSON: it goes back with the reason and the retry is accepted.
    with StubLLMServer([malformed_tool_call("GoalAnswer", '{"objective": "latency", '),
                        tool_call_reply("GoalAnswer", {**GOAL_ANSWER, "model_path": str(model)})]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = planner_node(_planner_state(model))
    assert out["status"] == "running", out
    plan, req = out["plan"], out["request"]
    assert plan["source"] == "llm" and plan["constraints"] == ["dtype=bf16"]
    assert (plan["target"], plan["chip"], plan["objective"]) == ("ascend-sim", "910b", "latency")
    assert req["objective"] == "latency" and req["policy"] == "hybrid"
    assert set(plan["budget"]) == {"max_runs", "max_wall_s", "tune_trials"}
    assert len(stub.requests) == 2
    reason = stub.requests[1]["messages"][-1]["content"]
    assert reason.startswith("rejected: the arguments of GoalAnswer are not valid JSON"), reason
    assert [r["agent"] for r in plan["llm_records"]] == ["planner", "planner"]
    assert all(r["tokens"] == 240 for r in plan["llm_records"])


@pytest.mark.slow  # starts the stub LLM server
def test_planner_falls_back_to_the_rule_parser_on_429_and_timeout(tmp_path: Path, llm_env: pytest.MonkeyPatch) -> None:
    from agents.nodes.planner import planner_node

    model = write_planted_model(tmp_path / "m")
    # 429 with a retry allowed: the client backs off and the retry answers.
    llm_env.setenv("NPUPORT_LLM_MAX_RETRIES", "1")
    with StubLLMServer([http_error(429, "slow down", retry_after="0"),
                        tool_call_reply("GoalAnswer", GOAL_ANSWER)]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = planner_node(_planner_state(model))
    assert len(stub.requests) == 2 and out["plan"]["source"] == "llm" and out["request"]["objective"] == "latency"
    # 429 with no retries left: the rule parser reads the goal, and the trace says why.
    llm_env.setenv("NPUPORT_LLM_MAX_RETRIES", "0")
    with StubLLMServer([http_error(429, "slow down")]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = planner_node(_planner_state(model))
    assert out["plan"]["source"] == "rules" and out["request"]["objective"] == "throughput"
    assert "RateLimitError" in out["trace"][0]["summary"] and "rule parser" in out["trace"][0]["summary"]
    # A timeout: the same fallback.
    llm_env.setenv("NPUPORT_LLM_TIMEOUT_S", "0.5")
    with StubLLMServer([delayed(tool_call_reply("GoalAnswer", GOAL_ANSWER), 1.5)]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = planner_node(_planner_state(model))
    assert out["plan"]["source"] == "rules" and "did not answer in time" in out["trace"][0]["summary"]


@pytest.mark.slow  # starts the stub LLM server
def test_planner_without_an_endpoint_or_with_the_rule_policy_never_calls_out(tmp_path: Path,
                                                                               llm_env: pytest.MonkeyPatch) -> None:
    from agents.nodes.planner import planner_node

    model = write_planted_model(tmp_path / "m")
    with StubLLMServer([]) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = planner_node(_planner_state(model, policy="rule"))
        llm_env.delenv("NPUPORT_LLM_MODEL")
        out2 = planner_node(_planner_state(model, policy="hybrid"))
    assert stub.requests == []
    assert out["plan"]["source"] == out2["plan"]["source"] == "rules"


# ---------------------------------------------------------------------------------------- code reader

FUSED = f'''import torch

try:
    import fused_rope_cuda  # a custom CUDA extension built with the model
except ImportError:
    fused_rope_cuda = None
API_KEY = "{SECRET}"


def rope(x):
    if fused_rope_cuda is not None:
        return fused_rope_cuda.apply(x)
    return x
'''


def _review_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The code-reader's answer, after checking it was sent the unclassified site with its context."""
    question = body["messages"][1]["content"]
    assert "fused.py:12: return fused_rope_cuda.apply(x)" in question, question
    return tool_call_reply("ReviewAnswer", {"findings": [
        {"hazard": "H3", "rule": "custom-cuda-extension", "file": "fused.py", "line": 12,
         "message": "fused_rope_cuda is a CUDA-only extension; on the NPU use the Python path or an NPU kernel",
         "category": "blocks running", "severity": "high"}]})


def _reader_state(tmp_path: Path) -> dict[str, Any]:
    model = write_planted_model(tmp_path / "m")
    (model / "fused.py").write_text(FUSED)
    from agents.state import target_dict
    from sandbox.targets import resolve_target

    # the state after the environment node: the patcher reads the resolved target (ascend-sim's host facts)
    return {"request": {"model_path": str(model), "policy": "hybrid"}, "workdir": str(tmp_path / "work"),
            "target": target_dict(resolve_target("ascend-sim"))}


@pytest.mark.slow  # starts the stub LLM server
def test_code_reader_sends_unclassified_cuda_sites_and_keeps_the_llm_findings(tmp_path: Path, npuport_home: Path,
                                                                              llm_env: pytest.MonkeyPatch) -> None:
    from agents.nodes.code_reader import code_reader_node

    state = _reader_state(tmp_path)
    with StubLLMServer({"code_reader": [_review_answer]}) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = code_reader_node(state)
    assert stub.agents == ["code_reader"]
    llm = [f for f in out["findings"] if f["rule"].startswith("llm-")]
    assert [(f["file"], f["line"], f["hazard"]) for f in llm] == [("fused.py", 12, "H3")]
    assert llm[0]["snippet"] == "return fused_rope_cuda.apply(x)"
    assert "proposed 1 finding" in out["trace"][-1]["summary"]
    records = list((tmp_path / "work" / "llm").glob("*.json"))
    assert len(records) == 1
    text = records[0].read_text()
    rec = json.loads(text)
    assert rec["agent"] == "code_reader" and rec["tokens"] == 240 and rec["usage"]["total_tokens"] == 240
    assert SECRET not in text and "[scrubbed]" in text  # the key in the code context is scrubbed
    assert "stub-key-0123456789" not in text


@pytest.mark.slow  # starts the stub LLM server
def test_code_reader_stops_asking_when_the_budget_is_spent(tmp_path: Path, npuport_home: Path,
                                                           llm_env: pytest.MonkeyPatch) -> None:
    from agents.nodes.code_reader import code_reader_node

    llm_env.setenv("NPUPORT_LLM_TOKEN_BUDGET", "100")  # one 240-token exchange spends it
    state = _reader_state(tmp_path)
    with StubLLMServer({"code_reader": [tool_call_reply("read_file", {"path": "fused.py"})]}) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        out = code_reader_node(state)
    assert len(stub.requests) == 1  # no call after the budget is spent
    assert not [f for f in out["findings"] if f["rule"].startswith("llm-")]
    note = out["trace"][-1]["summary"]
    assert "token budget of 100 tokens is spent" in note and "rule findings stand" in note
    assert json.loads((tmp_path / "work" / "llm_usage.json").read_text())["tokens"] == 240


def test_max_cost_lowers_the_token_budget(llm_env: pytest.MonkeyPatch) -> None:
    from knowledge.settings import LLMSettings

    llm_env.setenv("NPUPORT_LLM_MAX_COST_USD", "0.5")
    llm_env.setenv("NPUPORT_LLM_USD_PER_MILLION_TOKENS", "10")
    assert LLMSettings().port_token_limit == 50_000  # below the 200k token budget
    llm_env.setenv("NPUPORT_LLM_USD_PER_MILLION_TOKENS", "0")
    assert LLMSettings().port_token_limit == 200_000  # no price: only the token budget


# -------------------------------------------------------------------------------------------- patcher


@pytest.mark.slow  # starts the stub LLM server
def test_patcher_asks_the_llm_for_findings_no_codemod_covers_and_rejects_an_edit_that_does_not_apply(
        tmp_path: Path, npuport_home: Path, llm_env: pytest.MonkeyPatch) -> None:
    from agents.nodes.code_reader import code_reader_node
    from agents.nodes.patcher import patcher_node
    from agents.workspace import Workspace

    state = _reader_state(tmp_path)
    bad = {"fixes": [{"finding_ids": [], "summary": "drop the extension", "diff":
                      "--- a/fused.py\n+++ b/fused.py\n@@ -1,2 +1,2 @@\n-    return no_such_line(x)\n+    return x\n"}]}

    def good(body: dict[str, Any]) -> dict[str, Any]:
        assert "rejected" in body["messages"][-1]["content"], body["messages"][-1]  # the reason came back
        fid = next(f for f in state["findings"] if f["rule"].startswith("llm-"))["id"]
        return tool_call_reply("FixPlan", {"fixes": [{"finding_ids": [fid], "summary": "use the Python rope",
                                                      "edits": [{"file": "fused.py",
                                                                 "search": "        return fused_rope_cuda.apply(x)\n",
                                                                 "replace": "        return x  # no CUDA "
                                                                            "extension\n"}]}]},
                               call_id="call_2")

    with StubLLMServer({"code_reader": [_review_answer], "patcher": [tool_call_reply("FixPlan", bad), good]}) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        state.update(code_reader_node(state))
        out = patcher_node(state)
    assert stub.agents == ["code_reader", "patcher", "patcher"]
    llm_patches = [p for p in out["patches"] if p["codemod"] == "llm-edit"]
    assert len(llm_patches) == 1 and llm_patches[0]["files"] == ["fused.py"]
    ws = Workspace(Path(state["workdir"]))
    assert "return x  # no CUDA extension" in (ws.model_dir / "fused.py").read_text()
    msg = ws.git("log", "-1", "--format=%B", llm_patches[0]["commit"])
    assert "[prompt llm/003-patcher.json]" in msg, msg
    assert (Path(state["workdir"]) / "llm" / "003-patcher.json").is_file()
    assert any("LLM patcher planned 1 fix" in t["summary"] for t in out["trace"])


# ---------------------------------------------------------------------------------------------- tuner


@pytest.mark.slow  # starts the stub LLM server
def test_tuner_llm_proposals_stay_inside_the_constraint_space_and_the_optimiser_judges(
        tmp_path: Path, llm_env: pytest.MonkeyPatch) -> None:
    from agents.tuning.port import llm_proposals, space_for
    from agents.tuning.search import Budget, Outcome, npuport_search
    from agents.tuning.space import HostFacts

    facts = HostFacts(target="cpu", cores=2)
    space = space_for(facts)
    outside = {"trials": [{"batch": 64}]}  # not a value of the space: sent back with the reason
    answer = {"trials": [{"batch": 2, "dtype": "bfloat16"},  # feasible
                         {"batch": 4, "compile": "reduce-overhead"}]}  # pruned on the CPU by a constraint
    state = {"request": {"policy": "llm", "objective": "latency"}, "workdir": str(tmp_path)}
    with StubLLMServer({"tuner": [tool_call_reply("TrialsAnswer", outside),
                                  tool_call_reply("TrialsAnswer", answer)]}) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        kept, note = llm_proposals(state, space, facts)
    assert "batch=64 is not one of" in json.dumps(stub.requests[1]["messages"])
    assert kept == [{"batch": 2, "dtype": "bfloat16"}]
    assert "1 inside the constraint space, 1 rejected" in note

    def evaluate(p: dict[str, Any]) -> Outcome:  # a synthetic landscape: the search is what is tested
        return Outcome(value=10.0 * p["batch"] + (5.0 if p["dtype"] == "bfloat16" else 0.0))

    res = npuport_search(space, facts, evaluate, Budget(max_trials=6), proposals=kept)
    notes = [t.note for t in res.trials]
    assert notes[:2] == ["start at the priors", "LLM proposal"]
    assert res.trials[1].params["batch"] == 2 and res.trials[1].params["dtype"] == "bfloat16"
    # The prior start (batch 8) beats the proposal, so the optimiser keeps it as the incumbent.
    assert res.best is not None and res.best.params["batch"] == 8
