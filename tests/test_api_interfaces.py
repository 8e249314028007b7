"""Conventions clients rely on, against the app served on loopback: the stock ``openai`` client lists
models and streams a port; every error has one schema and OpenAPI documents 401; /docs works offline
(its assets come from the wheel, not a CDN); the page's controls come from /v1/options; chat
messages (Studio's chat input) are read as the goal and the run replies with an AI message."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai import OpenAI
from test_api_chat import collect, fake_server  # noqa: F401 - fixture

from graph.conversation import normalise_input, summary, with_reply

H = {"Authorization": "Bearer tok"}


def assert_error(r: httpx.Response, status: int, needle: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"type", "message", "code"} and body["error"]["code"] == status, body
    assert needle in body["error"]["message"]


def test_openai_client_lists_models_and_streams_a_port(fake_server: str) -> None:  # noqa: F811
    client = OpenAI(base_url=f"{fake_server}/v1", api_key="tok")
    assert [m.id for m in client.models.list()] == ["npuport"]
    assert client.models.retrieve("npuport").owned_by == "npuport"
    text, parts = collect(client.chat.completions.create(
        model="npuport", stream=True, messages=[{"role": "user", "content": "port the model in m1 on the cpu"}]))
    assert len(parts) >= 6 and "ended: **validated**" in text
    with pytest.raises(Exception) as info:  # noqa: PT011 - the client raises its own error types
        OpenAI(base_url=f"{fake_server}/v1", api_key="nope").models.list()
    assert "401" in str(info.value)


def test_every_error_has_one_schema(fake_server: str) -> None:  # noqa: F811
    assert_error(httpx.get(f"{fake_server}/v1/ports"), 401, "missing bearer token")
    assert_error(httpx.get(f"{fake_server}/v1/models", headers={"Authorization": "Bearer bad"}), 401)
    assert_error(httpx.get(f"{fake_server}/v1/ports/nope", headers=H), 404, "nope")
    assert_error(httpx.get(f"{fake_server}/v1/models/gpt-4", headers=H), 404)
    assert_error(httpx.post(f"{fake_server}/v1/ports", headers={**H, "Content-Type": "application/json"},
                            content=b"{not json"), 400)
    assert_error(httpx.post(f"{fake_server}/v1/ports", headers=H, content=b"{not json"), 415)  # no JSON declared
    assert_error(httpx.post(f"{fake_server}/v1/ports", headers=H, json={"goal": 3}), 422)
    assert_error(httpx.post(f"{fake_server}/v1/ports", headers={"Authorization": "Bearer ro"}, json={"goal": "x"}), 403)
    assert_error(httpx.post(f"{fake_server}/v1/chat/completions", headers=H, json={"messages": []}), 422)
    assert_error(httpx.get(f"{fake_server}/no/such/route"), 404)


def test_openapi_documents_401_with_the_error_schema(fake_server: str) -> None:  # noqa: F811
    spec = httpx.get(f"{fake_server}/openapi.json").json()
    assert "ErrorBody" in spec["components"]["schemas"]
    for path, method in (("/v1/ports", "get"), ("/v1/ports", "post"), ("/v1/models", "get"),
                         ("/v1/chat/completions", "post"), ("/v1/ports/{job_id}/pending", "get")):
        doc = spec["paths"][path][method]["responses"]
        assert doc["401"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody"), (path, method)
    assert "401" not in spec["paths"]["/healthz"]["get"]["responses"]


def test_docs_and_redoc_are_served_from_local_assets(fake_server: str) -> None:  # noqa: F811
    import re

    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{fake_server}{page}").text
        srcs = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
        assert srcs, html[:500]
        for src in srcs:
            assert not src.startswith("http"), f"{page} loads {src} from the network"
            r = httpx.get(f"{fake_server}{src}")
            assert r.status_code == 200 and len(r.content) > 1000, src


def test_options_come_from_the_port_request(fake_server: str) -> None:  # noqa: F811
    o = httpx.get(f"{fake_server}/v1/options", headers=H).json()
    assert o["chips"] == ["910b", "a3", "310p"] and "ascend-sim" in o["targets"] and "hybrid" in o["policies"]
    assert o["defaults"]["chip"] == "910b"


def test_chat_messages_are_the_goal_and_the_reply_is_an_ai_message() -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    state = {"messages": [HumanMessage("hi"), AIMessage("hello"), HumanMessage("port the model in ./m on the cpu")],
             "target": "cpu", "request": {"chip": "a3"}}
    norm = normalise_input(state)
    assert norm["goal"] == "port the model in ./m on the cpu"
    assert norm["request"] == {"target": "cpu", "chip": "a3"}
    # Studio may send plain dicts instead of message objects
    assert normalise_input({"messages": [{"type": "human", "content": "port ./x"}]})["goal"] == "port ./x"
    assert normalise_input({"goal": "g", "messages": [HumanMessage("other")]})["goal"] == "g"

    def reporter(_: dict) -> dict:  # type: ignore[type-arg]
        return {"status": "validated", "reason": "tokens match", "bundle": {"dir": "/tmp/b"}}

    patch = {"id": "patch-1", "commit": "c1", "summary": "H1 device-agnostic"}
    out = with_reply(reporter)({"patches": [patch], "numerics": {"verdict": "match"}})
    (msg,) = out["messages"]
    assert isinstance(msg, AIMessage) and "**validated**: tokens match" in msg.content
    assert "H1 device-agnostic" in msg.content and "/tmp/b" in msg.content
    assert "failed" in summary({"reason": "model path x does not exist"})


def test_graph_schemas_are_typed_for_studio() -> None:
    from graph.builder import compile_graph

    g = compile_graph()
    inp, out = g.get_input_jsonschema(), g.get_output_jsonschema()
    assert {"goal", "model_path", "target", "chip", "messages", "request"} <= set(inp["properties"])
    assert {"status", "reason", "bundle", "messages"} <= set(out["properties"])


def test_serve_prints_its_url_with_the_token(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    from api import serve
    from knowledge.settings import ServiceSettings as Settings

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)  # everything up to listening, nothing after
    serve.serve("127.0.0.1", 8765, settings=Settings(home=tmp_path / "h"))
    err = capsys.readouterr().err
    token = err.rsplit("serve-token: ", 1)[1].split()[0]
    assert f"http://localhost:8765/#token={token}" in err
    # a restart keeps the token (and with it the owner of the earlier jobs): it lives in the home, 0600
    kept = tmp_path / "h" / "serve-token"
    assert kept.read_text().strip() == token and kept.stat().st_mode & 0o777 == 0o600
    serve.serve("127.0.0.1", 8765, settings=Settings(home=tmp_path / "h"))
    assert f"#token={token}" in capsys.readouterr().err
