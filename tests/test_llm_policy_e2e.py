"""End to end: a scripted LLM fixes a planted failure that no recipe covers, talking through the REAL
``ChatOpenAI`` client to a local OpenAI-compatible HTTP stub on 127.0.0.1 (tests/llm_stub.py).
Only the LLM service is faked; the graph, workspace, sandbox runs, patcher and validator are real."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.llm_stub import StubLLMServer, text_reply, tool_call_reply

MANIFEST = """name: planted
entry:
  class: modeling_planted:PlantedLM
config: config.json
inputs: modeling_planted:make_inputs
run:
  method: generate
  kwargs: {max_new_tokens: 4}
"""

# Works as written on a CUDA host (and so in the reference run, under the cuda -> cpu redirect);
# anywhere else it rejects its own fallback layout. No recipe knows this check.
PLANTED = '''import torch
from torch import nn


class PlantedLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 16)
        self.head = nn.Linear(16, config["vocab"])

    def forward(self, ids):
        return self.head(self.emb(ids))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        layout = "packed" if torch.cuda.is_available() else "strided"
        if layout != "packed":
            raise RuntimeError("npuport-planted: unsupported layout " + layout)
        ids = input_ids
        out = []
        for _ in range(max_new_tokens):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            out.append(nxt)
        return torch.cat(out, dim=1)


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab"], (1, 5), generator=g)}
'''

SEARCH = ('        if layout != "packed":\n'
          '            raise RuntimeError("npuport-planted: unsupported layout " + layout)\n')
REPLACE = ('        if layout not in ("packed", "strided"):  # both layouts compute the same thing\n'
           '            raise RuntimeError("npuport-planted: unsupported layout " + layout)\n')


def write_planted_model(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "npuport.yaml").write_text(MANIFEST)
    (root / "config.json").write_text(json.dumps({"vocab": 32}))
    (root / "modeling_planted.py").write_text(PLANTED)
    return root


def _answer_after_reading(body: dict[str, Any]) -> dict[str, Any]:
    """The LLM's second turn: it has read the file (the tool result is in the request) and answers
    with a search/replace edit."""
    tool_msgs = [m for m in body["messages"] if m["role"] == "tool"]
    assert tool_msgs and "npuport-planted: unsupported layout" in tool_msgs[-1]["content"], body["messages"]
    return tool_call_reply("DiagnosisAnswer", {
        "kind": "unsupported-layout",
        "summary": "generate rejects the 'strided' layout it picks when no CUDA device is present, "
                   "although the decode loop does not depend on the layout",
        "file": "modeling_planted.py", "line": 18,
        "fix": {"edits": [{"file": "modeling_planted.py", "search": SEARCH, "replace": REPLACE}]},
        "citations": [],
    }, call_id="call_2")


def _script() -> list[Any]:
    return [tool_call_reply("read_file", {"path": "modeling_planted.py"}, call_id="call_1"), _answer_after_reading]


@pytest.fixture()
def llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("NPUPORT_LLM_BASE_URL", "NPUPORT_LLM_MODEL", "NPUPORT_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NPUPORT_LLM_MODEL", "stub-model")
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", "stub-key")
    monkeypatch.setenv("NPUPORT_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("NPUPORT_LLM_TIMEOUT_S", "30")
    monkeypatch.setenv("NPUPORT_SANDBOX", "process")


def _graph_script() -> dict[str, list[Any]]:
    """Through the graph the code-reader asks too (the review finds nothing new here); the debugger
    then reads the file and answers with the edit."""
    return {"code_reader": [tool_call_reply("ReviewAnswer", {"findings": []}, call_id="call_r")],
            "patcher": [tool_call_reply("FixPlan", {"fixes": []}, call_id="call_p")],
            "debugger": _script()}


def _assert_stub_conversation(stub: StubLLMServer) -> None:
    assert all(p == "/v1/chat/completions" for p in stub.paths)
    requests = [r for r, a in zip(stub.requests, stub.agents, strict=True) if a == "debugger"]
    assert len(requests) == 2, [r["messages"][-1] for r in requests]
    first = requests[0]
    assert first["model"] == "stub-model"
    tools = [t["function"]["name"] for t in first["tools"]]
    assert {"read_file", "grep", "search_kb", "run_in_sandbox", "DiagnosisAnswer"} <= set(tools)
    system = first["messages"][0]
    assert system["role"] == "system" and "npuport debugger" in system["content"]
    user = first["messages"][1]["content"]
    assert "npuport-planted: unsupported layout strided" in user and "modeling_planted.py" in user
    assert stub.headers[0].get("authorization") == "Bearer stub-key"


@pytest.mark.slow
def test_hybrid_policy_ports_a_planted_failure_through_the_graph(tmp_path: Path, npuport_home: Path,
                                                                 llm_env: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    model = write_planted_model(tmp_path / "planted")
    out = tmp_path / "bundle"
    with StubLLMServer(_graph_script()) as stub:
        monkeypatch.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        state = run_port({"request": {"model_path": str(model), "target": "cpu", "policy": "hybrid",
                                      "out_dir": str(out)}}, "llm-e2e")
    assert state["status"] == "validated", state.get("reason")
    assert state["numerics"]["verdict"] == "match"
    llm_diags = [d for d in state["diagnoses"] if d["params"].get("by") == "llm"]
    assert len(llm_diags) == 1 and llm_diags[0]["fix"] == "llm-edit"
    assert llm_diags[0]["params"]["llm_tokens"] == 2 * 240  # usage the stub reported, two turns
    assert [p["codemod"] for p in state["patches"]][-1] == "llm-edit"
    patch = (out / "port.patch").read_text()
    assert '+        if layout not in ("packed", "strided"):' in patch
    assert '-        if layout != "packed":' in patch
    assert state["counters"]["port_runs"] == 2  # the failure no recipe predicted, then the fixed run
    _assert_stub_conversation(stub)
    # Every CUDA-looking line is classified by a rule, so the hybrid code-reader does not ask; the
    # patcher has no finding without a codemod; only the debugger asks.
    assert stub.agents == ["debugger", "debugger"]
    assert any("LLM code review is not needed" in t["summary"] for t in state["trace"] if t["agent"] == "code_reader")
    # The bundle: the LLM's edit is its own commit, whose message names the prompt that produced it,
    # and that prompt (with its response and token count) is in the bundle's llm/ folder.
    llm_patch = state["patches"][-1]
    from agents.workspace import Workspace

    msg = Workspace(Path(state["workdir"])).git("log", "-1", "--format=%B", llm_patch["commit"])
    pid = re.search(r"\[prompt llm/([\w-]+)\.json\]", msg)
    assert pid and pid.group(1).endswith("-debugger"), msg
    assert llm_patch["files"] == ["modeling_planted.py"]
    rec = json.loads((out / "llm" / f"{pid.group(1)}.json").read_text())
    assert rec["agent"] == "debugger" and rec["tokens"] == 240
    assert rec["response"]["tool_calls"][0]["name"] == "DiagnosisAnswer"
    assert any("npuport-planted: unsupported layout strided" in str(m["content"]) for m in rec["messages"])
    assert "stub-key" not in "".join(p.read_text() for p in (out / "llm").glob("*.json"))
    report = json.loads((out / "report.json").read_text())
    assert report["llm"]["exchanges"] == len(stub.requests) and report["llm"]["tokens"] == 240 * len(stub.requests)
    assert "## LLM" in (out / "report.md").read_text()


@pytest.mark.slow
def test_hybrid_policy_reports_the_fallback_when_the_llm_debugger_is_rate_limited(
        tmp_path: Path, npuport_home: Path, llm_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port
    from tests.llm_stub import http_error

    model = write_planted_model(tmp_path / "planted")
    out = tmp_path / "bundle"
    script = {**_graph_script(), "debugger": [http_error(429, "rate limited")]}
    with StubLLMServer(script) as stub:
        monkeypatch.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        state = run_port({"request": {"model_path": str(model), "target": "cpu", "policy": "hybrid",
                                      "out_dir": str(out)}}, "llm-429")
    assert stub.agents.count("debugger") == 1
    assert state["status"] == "failed"
    assert "the LLM gave no usable fix (OpenAIRateLimitError: Error code: 429" in state["reason"], state["reason"]
    assert "no recipe covers" in state["reason"]
    rec = json.loads(sorted((out / "llm").glob("*-debugger.json"))[-1].read_text())
    assert rec["response"] is None and "RateLimitError" in rec["error"]
    assert "llm-edit" not in (model / "modeling_planted.py").read_text()  # the original is untouched
    assert 'if layout != "packed"' in (model / "modeling_planted.py").read_text()


@pytest.mark.slow
def test_hybrid_policy_fixes_a_planted_failure_through_policy_patcher_and_sandbox(
        tmp_path: Path, npuport_home: Path, llm_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same port without the graph: real sandbox runs, the hybrid policy from get_policy (so the
    ChatOpenAI client is built from the environment), the patcher's apply_fix, and the reference run."""
    from agents.fixing.commits import apply_fix
    from agents.models import Diagnosis
    from agents.policies import PolicyContext, get_policy
    from agents.reading.entry import discover_entry
    from agents.runs import record_of
    from agents.workspace import Workspace
    from sandbox.harness.runner import run_harness
    from sandbox.targets import Target

    model = write_planted_model(tmp_path / "planted")
    ws = Workspace.create(model, tmp_path / "work")
    entry = discover_entry(ws.model_dir)
    manifest = entry.as_manifest_dict()
    cpu = Target("cpu", "cpu")

    def run(n: int) -> Any:
        return record_of(run_harness(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / f"run-{n}",
                                     manifest=manifest, target=cpu), f"run-{n}", "port", "cpu")

    first = run(1)
    assert not first.ok and first.exception is not None
    assert "npuport-planted" in first.exception.message
    history: list[Diagnosis] = []
    with StubLLMServer(_script()) as stub:
        monkeypatch.setenv("NPUPORT_LLM_BASE_URL", stub.base_url)
        policy = get_policy("hybrid", context=PolicyContext(workdir=ws.root, entry=manifest))
        diag = policy.diagnose(first.id, first.exception, history)
    _assert_stub_conversation(stub)
    assert diag.fix == "llm-edit" and diag.params["by"] == "llm" and diag.kind == "unsupported-layout"
    assert diag.signature.startswith("exception:RuntimeError@modeling_planted.py:")
    action = get_policy("hybrid").fix_for(diag)  # the patcher node builds its own policy: no state needed
    assert action is not None and action.files == ["modeling_planted.py"]
    patch, notes = apply_fix(ws, action, 1)
    assert patch is not None, notes
    assert patch.codemod == "llm-edit" and patch.diagnosis_id == diag.id
    assert 'if layout not in ("packed", "strided")' in (ws.model_dir / "modeling_planted.py").read_text()
    second = run(2)
    assert second.ok, second.exception
    ref = record_of(run_harness(workdir=ws.root, model_dir=model, run_dir=ws.runs_dir / "reference",
                                manifest=manifest, target=cpu, reference=True), "reference", "reference", "cpu")
    assert ref.ok and ref.tokens == second.tokens
    assert json.loads((ws.root / "llm_usage.json").read_text())["tokens"] == 2 * 240


def test_stub_server_answers_only_on_loopback_and_fails_loudly_when_the_script_ends(
        llm_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ChatOpenAI client against the stub, streaming included; an extra call is an error."""
    from langchain_openai import ChatOpenAI

    with StubLLMServer([text_reply("hello there", prompt_tokens=7, completion_tokens=2),
                        text_reply("streamed reply")]) as stub:
        assert stub.base_url.startswith("http://127.0.0.1:")
        llm = ChatOpenAI(model="stub-model", base_url=stub.base_url, api_key="k", max_retries=0,  # type: ignore[arg-type]
                         stream_usage=True)
        msg = llm.invoke("hi")
        assert msg.content == "hello there" and msg.usage_metadata and msg.usage_metadata["total_tokens"] == 9
        chunks = list(llm.stream("hi again"))
        assert "".join(str(c.content) for c in chunks) == "streamed reply"
        with pytest.raises(Exception, match="script is used up"):
            llm.invoke("one more")
    assert stub.requests[1]["stream"] is True
