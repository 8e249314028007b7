"""The LLM agents END TO END through the graph, and their reasoning streamed by the service.

The LLM service is the only fake: tests/llm_stub.StubLLMServer, a scripted OpenAI-compatible server on
127.0.0.1 reached by the real langchain-openai client. The graph, workspace, scanner, sandbox runs,
patcher, validator, tuner and the HTTP service (uvicorn on a loopback port, driven by the official
``openai`` client and by httpx for the job's SSE stream) are real.

One port through the chat API (policy ``llm``, tuning on) exercises every agent and most failure modes:
the planner is rate limited (429) and succeeds on the client's retry; the code-reader's first answer is
malformed JSON (rejected with the reason, the retry is accepted); the patcher's first diff does not apply
(rejected with the reason, the retry is applied as its own commit naming its prompt); the debugger's LLM
times out and the rule recipe fixes the failure instead; the tuner's first proposal lies outside the space
(rejected), the second is measured by the optimiser, which stays the judge. A second port spends its
token budget on malformed answers: the code-reader falls back to its rule findings after the retries,
the patcher to the rule plan, and the report says so.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.llm_stub import StubLLMServer, delayed, http_error, malformed_tool_call, tool_call_reply
from tests.test_api_helpers import free_port, wait_http
from tests.test_llm_policy_e2e import MANIFEST, PLANTED, REPLACE, SEARCH

# The planted model of test_llm_policy_e2e (a device-dependent layout check no recipe covers), plus a
# hard-coded ``.cuda()`` in the decode loop: a hazard the rules know (H1, the ``device-agnostic`` recipe).
CUDA_LINE = "        ids = input_ids\n"
PLANTED_CUDA = PLANTED.replace(CUDA_LINE, "        ids = input_ids.cuda()\n")
LAYOUT_LINE = PLANTED.splitlines().index('        if layout != "packed":') + 1


def write_model(root: Path, source: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "npuport.yaml").write_text(MANIFEST)
    (root / "config.json").write_text(json.dumps({"vocab": 32}))
    (root / "modeling_planted.py").write_text(source)
    return root


@pytest.fixture()
def llm_env(monkeypatch: pytest.MonkeyPatch, npuport_home: Path) -> pytest.MonkeyPatch:
    for k in ("NPUPORT_LLM_BASE_URL", "NPUPORT_LLM_MODEL", "NPUPORT_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NPUPORT_LLM_MODEL", "stub-model")
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", "stub-key-0123456789")
    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    return monkeypatch


def serve(settings: Any, builder: Any = None) -> Iterator[str]:
    """The app served by uvicorn in a thread on a free loopback port (the real graph unless ``builder``)."""
    import uvicorn

    from api.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, graph_builder=builder), host="127.0.0.1", port=port,
                                           log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(15)


def sse_events(base: str, job_id: str, token: str) -> list[tuple[str, dict[str, Any]]]:
    """The job's whole SSE stream (GET /v1/ports/{id}/events), read until the server ends it."""
    out: list[tuple[str, dict[str, Any]]] = []
    event = ""
    with httpx.stream("GET", f"{base}/v1/ports/{job_id}/events", headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                out.append((event, json.loads(line.split(":", 1)[1])))
    return out


# ------------------------------------------------------------------------------------ the chat port

GOAL = ("port the model in planted here on the plain cpu; one answer at a time matters most, "
        "keep float32 and find its best settings")


def _chat_script(model: Path) -> dict[str, list[Any]]:
    plan = {"target": "cpu", "objective": "latency", "constraints": ["dtype=float32"], "tune": True}
    review = {"findings": [{"hazard": "H1", "rule": "device-dependent-branch", "file": "modeling_planted.py",
                            "line": LAYOUT_LINE, "message": "rejects the layout it picks without CUDA",
                            "category": "blocks running", "severity": "high"}]}

    def review_after_rejection(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        assert last["role"] == "tool"
        assert "rejected: the arguments of ReviewAnswer are not valid JSON" in last["content"]
        return tool_call_reply("ReviewAnswer", review, call_id="call_r2")

    stale = ("--- a/modeling_planted.py\n+++ b/modeling_planted.py\n@@ -1,2 +1,2 @@\n-    if layout == 'v1':\n"
             "+    if True:\n")

    def plan_after_rejection(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        assert last["role"] == "tool" and last["content"].startswith("rejected: fix 1:"), last
        fid = re.search(r"- (H1-modeling_planted\.py-\d+-llm-device-dependent-branch):", body["messages"][1]["content"])
        assert fid, body["messages"][1]["content"]
        # Only the layout check: the hard-coded .cuda() is left to the run (and so to the debugger).
        return tool_call_reply("FixPlan", {"fixes": [{"finding_ids": [fid.group(1)], "summary": "accept both layouts",
                                                      "edits": [{"file": "modeling_planted.py", "search": SEARCH,
                                                                 "replace": REPLACE}]}]}, call_id="call_p2")

    never = tool_call_reply("DiagnosisAnswer", {"kind": "x", "summary": "too late", "citations": []})
    return {
        "planner": [http_error(429, "slow down", retry_after="0"), tool_call_reply("GoalAnswer", plan)],
        "code_reader": [malformed_tool_call("ReviewAnswer", '{"findings": [{"hazard": "H1", '), review_after_rejection],
        "patcher": [tool_call_reply("FixPlan",
                                    {"fixes": [{"finding_ids": [], "summary": "stale diff", "diff": stale}]}),
                    plan_after_rejection],
        # Slower than the client's timeout, twice (the client retries once).
        "debugger": [delayed(never, 8.0), delayed(never, 8.0)],
        "tuner": [tool_call_reply("TrialsAnswer", {"trials": [{"batch": 64}]}),
                  tool_call_reply("TrialsAnswer", {"trials": [{"batch": 2, "dtype": "float32"},
                                                              {"batch": 4, "compile": "reduce-overhead"}]},
                                  call_id="call_t2")],
    }


@pytest.mark.slow  # a whole port with tuning, through the served app
def test_chat_port_streams_every_agents_reasoning_and_survives_each_llm_failure(
        tmp_path: Path, npuport_home: Path, llm_env: pytest.MonkeyPatch) -> None:
    from openai import OpenAI

    from knowledge.settings import ServiceSettings as Settings
    from tests.test_api_chat import collect

    models = tmp_path / "models"
    model = write_model(models / "planted", PLANTED_CUDA)
    original = (model / "modeling_planted.py").read_text()
    llm_env.setenv("NPUPORT_LLM_MAX_RETRIES", "1")  # one retry with backoff (the 429, the timeout)
    llm_env.setenv("NPUPORT_LLM_TIMEOUT_S", "3")  # the stub answers at once, except the debugger (8 s)
    llm_env.setenv("NPUPORT_TUNE_TRIALS", "2")
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[models])
    with StubLLMServer(_chat_script(model)) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        for base in serve(settings):
            client = OpenAI(base_url=f"{base}/v1", api_key="tok", timeout=600)
            chunks = list(client.chat.completions.create(model="npuport", stream=True, metadata={"policy": "llm"},
                                                         messages=[{"role": "user", "content": GOAL}]))
            text, _ = collect(iter(chunks))
            job_id = text.split("job `")[1].split("`")[0]
            events = sse_events(base, job_id, "tok")
    assert "ended: **validated**" in text, text
    _check_reasoning_in_the_chat(chunks)
    _check_reasoning_in_the_events(events)
    # ---- the stub saw the retries: each agent asked as scripted, the debugger twice (timeout, retry)
    assert stub.agents.count("planner") == 2 and stub.agents.count("code_reader") == 2
    assert stub.agents.count("patcher") == 2 and stub.agents.count("debugger") == 2 and stub.agents.count("tuner") == 2
    bundle = npuport_home / "jobs" / job_id / "bundle"
    report = json.loads((bundle / "report.json").read_text())
    _check_bundle(report, bundle)
    _check_tuning(report)
    # secrets never reach the bundle; the user's folder is never written
    assert "stub-key-0123456789" not in "".join(p.read_text() for p in (bundle / "llm").glob("*.json"))
    assert (model / "modeling_planted.py").read_text() == original


def _check_reasoning_in_the_chat(chunks: list[Any]) -> None:
    """The chat stream: reasoning chunks in OpenAI's chunk format, marked as such."""
    reasoning = [(c.model_extra or {}).get("npuport") for c in chunks]
    thoughts = [(r["agent"], r["source"], c.choices[0].delta.content or "")
                for r, c in zip(reasoning, chunks, strict=True) if r and r.get("event") == "reasoning"]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    by_agent = {a for a, s, _ in thoughts if s == "llm"}
    assert {"planner", "code_reader", "patcher", "debugger", "tuner"} <= by_agent, thoughts
    said = "\n".join(t for _, _, t in thoughts)
    assert "_planner (LLM)_: answers GoalAnswer" in said
    assert "_code_reader (LLM)_: npuport rejected the answer: the arguments of ReviewAnswer are not valid JSON" in said
    assert re.search(r"_patcher \(LLM\)_: npuport rejected the answer: fix 1: .*modeling_planted\.py", said), said
    assert "_patcher (LLM)_: answers FixPlan: 1 fixes: accept both layouts" in said
    assert re.search(r"_debugger \(LLM\)_: the LLM call failed: the LLM did not answer in time: \w*TimeoutError", said)
    assert re.search(r"_debugger \(rules\)_: .*the rules decided: device-agnostic.*; fix: device-agnostic", said), said
    assert "_tuner (LLM)_: npuport rejected the answer: trial 1: batch=64 is not one of" in said
    assert "1 inside the constraint space, 1 rejected (pruned by constraints)" in said


def _check_reasoning_in_the_events(events: list[tuple[str, dict[str, Any]]]) -> None:
    """The job's SSE stream carries the same reasoning as progress events."""
    progress = [d for e, d in events if e == "progress" and d["data"].get("kind") == "reasoning"]
    assert {d["data"]["agent"] for d in progress} >= {"planner", "code_reader", "patcher", "debugger", "tuner"}
    assert any(d["data"]["source"] == "rules" and d["data"]["agent"] == "debugger" for d in progress)
    assert events[-1][0] == "end" and events[-1][1]["status"] == "validated"


def _check_bundle(report: dict[str, Any], bundle: Path) -> None:
    """The bundle: the LLM's plan and patch with its prompt record, the debugger's fall-back to the rules."""
    assert report["plan"]["source"] == "llm" and report["request"]["objective"] == "latency"
    assert report["request"]["target"] == "cpu" and report["request"]["tune"] is True
    codemods = [p["codemod"] for p in report["patches"]]
    assert codemods == ["llm-edit", "device-agnostic"], codemods
    llm_patch = report["patches"][0]
    pid = re.search(r"\[prompt llm/([\w-]+)\.json\]", llm_patch["summary"])
    assert pid and pid.group(1).endswith("-patcher")
    rec = json.loads((bundle / "llm" / f"{pid.group(1)}.json").read_text())
    assert rec["response"]["tool_calls"][0]["args"]["fixes"][0]["summary"] == "accept both layouts"
    # the debugger fell back to the rules, and the report says so
    diag = report["diagnoses"][0]
    assert diag["fix"] == "device-agnostic" and "did not answer in time" in diag["summary"]
    md = (bundle / "report.md").read_text()
    assert "## LLM" in md
    assert re.search(r"did not answer in time: \w*TimeoutError\); the rules decided: device-agnostic", md), md
    assert report["counters"]["port_runs"] == 2  # the .cuda() failure, then the fixed run


def _check_tuning(report: dict[str, Any]) -> None:
    """The tuner: the in-space proposal was measured as its own trial; the optimiser picked the best."""
    trials = report["tuning"]["trials"]
    assert report["tuning"]["status"] == "done", report["tuning"]
    proposed = [t for t in trials if t["detail"].startswith("LLM proposal")]
    assert len(proposed) == 1 and proposed[0]["params"]["batch"] == 2
    assert proposed[0]["status"] == "ok" and proposed[0]["value"] is not None  # measured, not trusted
    # the best trial is deployed, or the untuned port when the final side-by-side measured it faster (a busy host)
    chosen = (report["tuning"].get("tuned") or {}).get("chosen")
    assert report["tuning"]["best"] in [t["params"] for t in trials if t["status"] == "ok"] or chosen == "untuned", \
        (report["tuning"]["best"], chosen)
    assert "1 inside the constraint space, 1 rejected" in report["tuning"]["detail"]
    assert any(d.startswith("tuner: ") and "LLM proposed 2 trial(s)" in d for d in report["llm"]["decisions"])


# ---------------------------------------------------------------------- a spent budget, through the graph


@pytest.mark.slow  # a whole port
def test_malformed_answers_spend_the_budget_and_the_rules_finish_the_port(
        tmp_path: Path, npuport_home: Path, llm_env: pytest.MonkeyPatch) -> None:
    """Three malformed code-reader answers (the first and two retries) are rejected with the reason, then
    the rule findings stand; they spent the token budget, so the patcher does not call out and the rule plan
    fixes the hazard the rules know. The port validates and the report says what fell back and why."""
    from graph.runner import run_port

    model = write_model(tmp_path / "cuda_only", PLANTED_CUDA.replace(
        '        if layout != "packed":\n            raise RuntimeError("npuport-planted: unsupported layout " + '
        'layout)\n', ""))
    out = tmp_path / "bundle"
    llm_env.setenv("NPUPORT_LLM_MAX_RETRIES", "0")
    llm_env.setenv("NPUPORT_LLM_TOKEN_BUDGET", "700")  # the stub reports 240 tokens an exchange
    bad = [malformed_tool_call("ReviewAnswer", '{"findings": [', call_id=f"call_{i}") for i in range(3)]
    events: list[tuple[str, dict[str, Any]]] = []
    with StubLLMServer({"code_reader": bad}) as stub:
        llm_env.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        state = run_port({"request": {"model_path": str(model), "target": "cpu", "policy": "llm", "out_dir": str(out)}},
                         "llm-budget", on_event=lambda k, d: events.append((k, d)))
    assert state["status"] == "validated", state.get("reason")
    assert stub.agents == ["code_reader"] * 3
    # each rejection went back with the reason
    for body in stub.requests[1:]:
        assert "rejected: the arguments of ReviewAnswer are not valid JSON" in body["messages"][-1]["content"]
    assert [p["codemod"] for p in state["patches"]] == ["device-agnostic"]
    assert state["counters"]["port_runs"] == 1
    report = json.loads((out / "report.json").read_text())
    decisions = "\n".join(report["llm"]["decisions"])
    assert "the LLM code review failed (AnswerRejected: the arguments of ReviewAnswer are not valid JSON); " \
           "the rule findings stand" in decisions, decisions
    assert "the LLM patcher gave no usable plan (the LLM token budget of 700 tokens is spent (720 used)); " \
           "the rule plan is used" in decisions, decisions
    assert report["llm"]["tokens"] == 720 and report["llm"]["exchanges"] == 3
    assert "the rule plan is used" in (out / "report.md").read_text()
    # the reasoning stream: the LLM's rejected turns, then the rules' decisions
    thoughts = [(d["agent"], d["source"], d["text"]) for k, d in events if k == "reasoning"]
    assert [t for t in thoughts if t[0] == "code_reader"][-1][1] == "rules"
    assert any(a == "patcher" and s == "rules" and "the recipes plan device-agnostic" in t for a, s, t in thoughts)
