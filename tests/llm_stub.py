"""Fakes of the LLM service, and nothing else: a scripted langchain chat model, and a local
OpenAI-compatible HTTP server (127.0.0.1 only) that answers ``/v1/chat/completions`` from a script,
so the real ``ChatOpenAI`` client and the real policy code run against it."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

# ------------------------------------------------------------------------------ scripted chat model


def ai_tool_call(name: str, args: dict[str, Any], call_id: str = "call_1", tokens: int = 100,
                 content: str = "") -> AIMessage:
    """A scripted assistant turn that calls one tool, with usage like a server would report."""
    return AIMessage(content=content, tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}],
                     usage_metadata={"input_tokens": tokens - 10, "output_tokens": 10, "total_tokens": tokens})


def ai_text(content: str, tokens: int = 50) -> AIMessage:
    return AIMessage(content=content,
                     usage_metadata={"input_tokens": tokens - 5, "output_tokens": 5, "total_tokens": tokens})


class ScriptedChatModel(GenericFakeChatModel):
    """A chat model that answers from a script of AIMessages (tool calls included), records what it
    was sent and which tools were bound, and streams (GenericFakeChatModel splits the content)."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    bound: list[list[str]] = Field(default_factory=list)
    tool_choices: list[Any] = Field(default_factory=list)

    @classmethod
    def of(cls, script: Sequence[AIMessage]) -> ScriptedChatModel:
        return cls(messages=iter(list(script)))

    def bind_tools(self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any) -> Any:
        specs = [convert_to_openai_tool(t) for t in tools]
        self.bound.append([s["function"]["name"] for s in specs])
        self.tool_choices.append(tool_choice)
        return self.bind(tools=specs, **kwargs)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        try:
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
        except StopIteration:
            raise AssertionError("the scripted LLM was called more often than the script allows") from None


# --------------------------------------------------------------------------- OpenAI-compatible stub

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def completion(message: dict[str, Any], prompt_tokens: int = 200, completion_tokens: int = 40) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return {
        "id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, **message},
                     "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def tool_call_reply(name: str, args: dict[str, Any], call_id: str = "call_1", **usage: int) -> dict[str, Any]:
    return completion({"tool_calls": [{"id": call_id, "type": "function",
                                       "function": {"name": name, "arguments": json.dumps(args)}}]}, **usage)


def text_reply(content: str, **usage: int) -> dict[str, Any]:
    return completion({"content": content}, **usage)


def agent_of(body: dict[str, Any]) -> str:
    """The npuport agent that sent a request, from its system prompt's title ("# npuport code reader")."""
    for m in body.get("messages") or []:
        if m.get("role") == "system":
            m_ = re.match(r"#\s*npuport\s+([\w ]+)", str(m.get("content") or ""))
            if m_:
                return m_.group(1).strip().replace(" ", "_")
    return "?"


def http_error(status: int, message: str = "scripted error", **headers: str) -> dict[str, Any]:
    """A scripted HTTP error (429 rate limit, 5xx), answered instead of a completion."""
    return {"_status": status, "_headers": headers, "error": {"message": message, "type": "scripted"}}


def delayed(reply: Reply, seconds: float) -> Reply:
    """A reply sent only after ``seconds`` (a client timeout shorter than that sees no answer)."""
    def later(body: dict[str, Any]) -> dict[str, Any]:
        data = reply(body) if callable(reply) else reply
        return {**data, "_delay": seconds}

    return later


def malformed_tool_call(name: str, raw_arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    """A tool call whose arguments are not valid JSON, as a confused model sends them."""
    return completion({"tool_calls": [{"id": call_id, "type": "function",
                                       "function": {"name": name, "arguments": raw_arguments}}]})


class StubLLMServer:
    """Serves scripted chat completions on 127.0.0.1:<free port>; records every request body.

    Use as a context manager; ``base_url`` is what NPUPORT_LLM_BASE_URL should be. When the script is
    used up it answers HTTP 500, so an unexpected extra call fails loudly.
    """

    def __init__(self, script: Sequence[Reply] | Mapping[str, Sequence[Reply]],
                 models: Sequence[str] = ("stub-model",)) -> None:
        # A mapping scripts each agent separately (keyed by the agent its system prompt names:
        # planner, code_reader, patcher, debugger, tuner), so agents may ask in any order.
        self.by_agent: dict[str, Iterator[Reply]] | None = (
            {k: iter(list(v)) for k, v in script.items()} if isinstance(script, Mapping) else None)
        self.script: Iterator[Reply] = iter([] if isinstance(script, Mapping) else list(script))
        self.models = list(models)
        self.agents: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                stub.paths.append(self.path)
                if self.path.endswith("/models"):
                    return self._send(200,
                                      {"object": "list", "data": [{"id": m, "object": "model"} for m in stub.models]})
                return self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append(body)
                stub.paths.append(self.path)
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                agent = agent_of(body)
                stub.agents.append(agent)
                if stub.by_agent is not None:
                    reply = next(stub.by_agent.get(agent, iter(())), None)
                else:
                    reply = next(stub.script, None)
                if reply is None:
                    return self._send(500, {"error": {"message": "the stub's script is used up"}})
                data = reply(body) if callable(reply) else reply
                if data.get("_delay"):
                    time.sleep(float(data["_delay"]))
                    data = {k: v for k, v in data.items() if k != "_delay"}
                if data.get("_status"):
                    return self._send(int(data["_status"]), {"error": data["error"]}, data.get("_headers"))
                if body.get("stream"):
                    return self._stream(data)
                return self._send(200, data)

            def _send(self, code: int, data: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                raw = json.dumps(data).encode()
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k.replace("_", "-"), v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                try:
                    self.wfile.write(raw)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up first (a scripted timeout)
                    return

            def _stream(self, data: dict[str, Any]) -> None:
                # One delta with the whole message, then the usage chunk, as OpenAI streams them.
                choice = data["choices"][0]
                msg = dict(choice["message"])
                for i, tc in enumerate(msg.get("tool_calls") or []):
                    tc["index"] = i
                chunks = [{**data, "object": "chat.completion.chunk", "usage": None,
                           "choices": [{"index": 0, "delta": msg, "finish_reason": None}]},
                          {**data, "object": "chat.completion.chunk", "usage": None,
                           "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
                          {**data, "object": "chat.completion.chunk", "choices": []}]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for c in chunks:
                    self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> StubLLMServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
