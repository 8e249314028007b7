"""OpenAI-compatible chat, driven by the official ``openai`` client against the app served by
uvicorn on a loopback port. The fast tests run the stand-in graph (they test the chat protocol);
the slow one ports examples/ocr_mini for real."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from openai import OpenAI
from test_api_helpers import fake_builder, free_port, wait_http

from api.app import create_app
from knowledge.settings import ServiceSettings as Settings

REPO = Path(__file__).resolve().parents[1]


def serve_in_thread(settings: Settings, builder: Any) -> Iterator[str]:
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


@pytest.fixture()
def fake_server(npuport_home: Path, tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"], "ro": ["read"]}, allowed_roots=[root])
    yield from serve_in_thread(settings, fake_builder)


def collect(stream: Any) -> tuple[str, list[str]]:
    parts: list[str] = []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            parts.append(delta)
    return "".join(parts), parts


def test_streaming_goal_then_status_report_in_same_conversation(fake_server: str) -> None:
    client = OpenAI(base_url=f"{fake_server}/v1", api_key="tok")
    meta = {"conversation_id": "c-42"}
    stream = client.chat.completions.create(
        model="npuport", stream=True, metadata=meta,
        messages=[{"role": "user", "content": "port the model in m1 to Ascend 910B on the cpu"}])
    text, parts = collect(stream)
    assert len(parts) >= 6  # the reply arrives as many deltas, one per agent step
    for agent in ("planner", "code_reader", "patcher", "executor", "reporter"):
        assert f"**{agent}**" in text
    assert "ended: **validated**" in text
    job_id = text.split("job `")[1].split("`")[0]
    # a later message of the same conversation (no history sent) asks about that job
    status = client.chat.completions.create(model="npuport", metadata=meta,
                                            messages=[{"role": "user", "content": "status?"}])
    content = status.choices[0].message.content or ""
    assert f"job `{job_id}` is validated" in content and "5 agent steps" in content
    report = client.chat.completions.create(model="npuport", metadata=meta,
                                            messages=[{"role": "user", "content": "show me the report"}])
    assert "# npuport report" in (report.choices[0].message.content or "")
    # another conversation knows nothing of it
    other = client.chat.completions.create(model="npuport", metadata={"conversation_id": "c-43"},
                                           messages=[{"role": "user", "content": "status?"}])
    assert job_id not in (other.choices[0].message.content or "")


def test_user_field_and_history_identify_the_conversation(fake_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = OpenAI(base_url=f"{fake_server}/v1", api_key="tok")
    first = client.chat.completions.create(model="npuport", user="alice",
                                           messages=[{"role": "user", "content": "port the model in m1 on the cpu"}])
    reply = first.choices[0].message.content or ""
    assert reply.startswith("Started job `")
    job_id = reply.split("`")[1]
    deadline = time.time() + 30
    while time.time() < deadline:
        st = client.chat.completions.create(model="npuport", user="alice",
                                            messages=[{"role": "user", "content": "status"}])
        if "validated" in (st.choices[0].message.content or ""):
            break
        time.sleep(0.2)
    assert f"job `{job_id}` is validated" in (st.choices[0].message.content or "")
    # a client that sends neither user nor metadata: the job quoted in the history is the conversation
    hist = client.chat.completions.create(model="npuport", messages=[
        {"role": "user", "content": "port the model in m1 on the cpu"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "how is it going?"}])
    assert f"job `{job_id}`" in (hist.choices[0].message.content or "")
    # another token cannot reach alice's job through the history
    with pytest.raises(Exception) as info:  # noqa: PT011 - the client raises its own error types
        OpenAI(base_url=f"{fake_server}/v1", api_key="wrong").chat.completions.create(
            model="npuport", messages=[{"role": "user", "content": "status"}])
    assert "401" in str(info.value)
    ro = OpenAI(base_url=f"{fake_server}/v1", api_key="ro").chat.completions.create(model="npuport", messages=[
        {"role": "assistant", "content": reply}, {"role": "user", "content": "status"}])
    assert job_id not in (ro.choices[0].message.content or "")


def test_cancel_through_chat(npuport_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.6")
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[root])
    for base in serve_in_thread(settings, fake_builder):
        client = OpenAI(base_url=f"{base}/v1", api_key="tok")
        first = client.chat.completions.create(model="npuport", user="bob",
                                               messages=[{"role": "user",
                                                          "content": "port the model in m1 on the cpu"}])
        job_id = (first.choices[0].message.content or "").split("`")[1]
        time.sleep(0.8)
        cancel = client.chat.completions.create(model="npuport", user="bob",
                                                messages=[{"role": "user", "content": "cancel it please"}])
        assert "Cancel requested" in (cancel.choices[0].message.content or "")
        deadline = time.time() + 20
        job: dict[str, Any] = {}
        while time.time() < deadline:
            job = httpx.get(f"{base}/v1/ports/{job_id}", headers={"Authorization": "Bearer tok"}).json()
            if job["status"] in ("cancelled", "validated", "failed"):
                break
            time.sleep(0.1)
        assert job["status"] == "cancelled" and job["steps"] < 5


def test_chat_bad_requests(fake_server: str) -> None:
    h = {"Authorization": "Bearer tok"}
    assert httpx.post(f"{fake_server}/v1/chat/completions", headers=h, json={"messages": []}).status_code == 422
    r = httpx.post(f"{fake_server}/v1/chat/completions", headers=h,
                   json={"messages": [{"role": "system", "content": "x"}]})
    assert r.status_code == 400 and "no user message" in r.text
    r = httpx.post(f"{fake_server}/v1/chat/completions", headers={**h, "Content-Type": "application/json"},
                   content=b"{oops")
    assert r.status_code == 400 and "malformed JSON" in r.text
    r = httpx.post(f"{fake_server}/v1/chat/completions", headers=h,
                   json={"messages": [{"role": "user", "content": "port the model in /etc"}]})
    assert r.status_code == 200 and "outside the allowed model roots" in r.json()["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_real_port_streams_through_openai_client(npuport_home: Path) -> None:
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[REPO / "examples"])
    for base in serve_in_thread(settings, None):
        client = OpenAI(base_url=f"{base}/v1", api_key="tok", timeout=600)
        text, parts = collect(client.chat.completions.create(
            model="npuport", stream=True, user="carol",
            messages=[{"role": "user", "content": "port the model in ocr_mini to Ascend 910B on the cpu"}]))
        assert "ended: **validated**" in text, text
        for agent in ("planner", "code_reader", "patcher", "executor", "validator", "reporter"):
            assert f"**{agent}**" in text
        report = client.chat.completions.create(model="npuport", user="carol",
                                                messages=[{"role": "user", "content": "report"}])
        content = report.choices[0].message.content or ""
        assert "# npuport report: ocr_mini\n\n**validated" in content  # the summary opens the report
        for question, needle in (("what did you change?", "change(s), one commit each"),
                                 ("why?", "validation: match"), ("what is left?", "left")):
            answer = client.chat.completions.create(model="npuport", user="carol",
                                                    messages=[{"role": "user", "content": question}])
            assert needle in (answer.choices[0].message.content or ""), (question, answer)


def test_the_chat_stream_names_the_deployment_phase_and_its_last_message_the_deployment(
        npuport_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_api_helpers import DEPLOY_PHASES, fake_builder_with_deployment

    monkeypatch.setenv("NPUPORT_FAKE_STEP_S", "0.3")
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]}, allowed_roots=[root])
    for base in serve_in_thread(settings, fake_builder_with_deployment):
        client = OpenAI(base_url=f"{base}/v1", api_key="tok")
        text, parts = collect(client.chat.completions.create(
            model="npuport", stream=True, messages=[{"role": "user", "content": "port the model in m1 on the cpu"}]))
        for phase in DEPLOY_PHASES:  # env, start, tokens, throughput: each its own line, as it happens
            assert phase in text, text
        assert "**deployment**" in text and "**deployer**" in text
        last = text.rsplit("ended:", 1)[1]
        assert "Deployment: served by vLLM (vllm-native); tokens PASS" in last, last


def test_a_goal_without_model_roots_says_how_to_set_them(npuport_home: Path) -> None:
    settings = Settings(home=npuport_home, tokens={"tok": ["read", "write"]})  # as a default `npuport serve`
    for base in serve_in_thread(settings, fake_builder):
        client = OpenAI(base_url=f"{base}/v1", api_key="tok")
        reply = client.chat.completions.create(
            model="npuport", messages=[{"role": "user", "content": "port the model in m1 on the cpu"}])
        text = reply.choices[0].message.content or ""
        assert "--model-root" in text and "NPUPORT_ALLOWED_ROOTS" in text, text
