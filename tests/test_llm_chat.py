"""The agents' reasoning as progress, offline: with no LLM endpoint configured the rule policy's decision
text streams through the service like the LLM's would (tests/test_llm_graph.py covers the LLM side,
whole ports with the stub endpoint). The app is served by uvicorn on a loopback port and driven by the
official ``openai`` client and by httpx for the job's SSE stream; the graph is a two-node stand-in whose
debugger node asks the REAL rule policy, so the decision text is the policy's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from tests.test_api_helpers import _fake_node
from tests.test_llm_graph import serve, sse_events


def _rule_debugger(state: dict[str, Any]) -> dict[str, Any]:
    from agents.models import Frame, StructuredException
    from agents.policies import get_policy
    from agents.trace import step

    exc = StructuredException(type="AssertionError", message="Torch not compiled with CUDA enabled",
                              frames=[Frame(file="modeling_x.py", line=7, func="generate", code="x.cuda()",
                                            in_model=True)])
    diag = get_policy(state["request"].get("policy", "rule")).diagnose("run-1", exc, [])
    return {"status": "running", "trace": [step("debugger", f"{diag.kind}: fix {diag.fix}")]}


def _builder() -> StateGraph[Any]:
    from graph.state import PortState

    g: StateGraph[Any] = StateGraph(PortState)
    g.add_node("debugger", _rule_debugger)
    g.add_node("reporter", _fake_node("reporter"))
    g.add_edge(START, "debugger")
    g.add_edge("debugger", "reporter")
    g.add_edge("reporter", END)
    return g


@pytest.fixture()
def offline_server(npuport_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from knowledge.settings import ServiceSettings as Settings

    for k in ("NPUPORT_LLM_BASE_URL", "NPUPORT_LLM_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(k, raising=False)
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[root])
    yield from serve(settings, builder=_builder)


@pytest.mark.parametrize("policy", ["rule", "hybrid"])  # hybrid with no endpoint: the rules decide, and say so
def test_rule_decisions_stream_as_reasoning_chunks_and_job_events(offline_server: str, policy: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{offline_server}/v1", api_key="tok")
    chunks = list(client.chat.completions.create(
        model="npuport", stream=True, metadata={"policy": policy},
        messages=[{"role": "user", "content": "port the model in m1 to Ascend 910B on the cpu"}]))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "ended: **validated**" in text, text
    marked = [((c.model_extra or {}).get("npuport"), c.choices[0].delta.content or "") for c in chunks if c.choices]
    reasoning = [(m, t) for m, t in marked if m and m.get("event") == "reasoning"]
    assert len(reasoning) == 1, marked
    meta, line = reasoning[0]
    assert (meta["agent"], meta["source"]) == ("debugger", "rules")
    assert line.startswith("  > _debugger (rules)_: cuda-assert: CUDA is called at modeling_x.py:7")
    assert line.rstrip().endswith("fix: device-agnostic")
    # The reasoning comes before the step that acted on it, and in the job's SSE stream as a progress event.
    assert text.index("_debugger (rules)_") < text.index("**debugger**: cuda-assert: fix device-agnostic")
    job_id = text.split("job `")[1].split("`")[0]
    events = sse_events(offline_server, job_id, "tok")
    progress = [d["data"] for e, d in events if e == "progress" and d["data"].get("kind") == "reasoning"]
    assert [(p["agent"], p["source"]) for p in progress] == [("debugger", "rules")]
    assert "fix: device-agnostic" in progress[0]["text"]


def test_a_client_without_metadata_gets_the_rule_policy(offline_server: str) -> None:
    """No ``metadata.policy``: the request's default (rule) decides, as before this feature."""
    import httpx

    r = httpx.post(f"{offline_server}/v1/chat/completions", headers={"Authorization": "Bearer tok"}, timeout=30,
                   json={"model": "npuport",
                         "messages": [{"role": "user", "content": "port the model in m1 on the cpu"}]})
    job_id = r.json()["npuport"]["job_id"]
    job = httpx.get(f"{offline_server}/v1/ports/{job_id}", headers={"Authorization": "Bearer tok"}, timeout=30).json()
    assert job["request"]["policy"] == "rule"
