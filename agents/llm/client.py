"""The one door to the LLM: ``LLMClient`` asks a role's question (agents/llm/roles/) and returns its
checked answer, counting tokens against the port's budget and saving every exchange.

The LLM (``langchain_openai.ChatOpenAI`` against any OpenAI-compatible endpoint, or any langchain chat
model given to the client) decides; our code acts. Each question is one conversation: the role's
system prompt (agents/prompts/<role>.md), the facts, and, where the role may read the model, tools
(read_file, grep, search_kb, run_in_sandbox) that our code executes with bounded output. The answer is
the role's pydantic record, offered to the model as one more tool (so it can answer in the same turn
as it reads), with ``with_structured_output`` as the fallback when it stops calling tools. Every
answer is checked by the role before it is accepted; an invalid one goes back with the reasons.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic import BaseModel, ValidationError

from agents.llm.prompts import load_prompt
from agents.llm.tools import ToolBox
from agents.reasoning import llm_turn_text, think, why_failed
from knowledge.errors import AnswerRejected, BudgetExhausted, LLMEditError, first_line
from knowledge.settings import LLMSettings

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage

A = TypeVar("A", bound=BaseModel)


@dataclass(frozen=True)
class Role(Generic[A]):
    """An agent role's contract with the LLM: its prompt (agents/prompts/<name>.md), the answer it
    expects, and whether it may read the model with tools."""

    name: str
    schema: type[A]
    tools: bool = True


class TokenBudget:
    """Tokens spent by the LLM on one port. With a ledger file (in the workspace) the count survives
    across graph nodes, each of which builds a fresh client, and across resumes."""

    def __init__(self, limit: int, ledger: Path | None = None) -> None:
        self.limit = limit
        self.ledger = ledger
        self._used = 0
        if ledger and ledger.is_file():
            try:
                self._used = int(json.loads(ledger.read_text()).get("tokens", 0))
            except (ValueError, AttributeError):
                self._used = 0

    @property
    def used(self) -> int:
        return self._used

    @property
    def exhausted(self) -> bool:
        return self._used >= self.limit

    def add(self, tokens: int) -> None:
        self._used += max(0, tokens)
        if self.ledger and self.ledger.parent.is_dir():
            self.ledger.write_text(json.dumps({"tokens": self._used, "limit": self.limit}))

    def check(self) -> None:
        if self.exhausted:
            raise BudgetExhausted(f"the LLM token budget of {self.limit} tokens is spent ({self._used} used)")


def tokens_of(ai: AIMessage, sent: Sequence[BaseMessage]) -> int:
    """Tokens of one exchange from the response's usage; a character estimate when the server sends none."""
    usage = ai.usage_metadata
    if usage and usage.get("total_tokens"):
        return int(usage["total_tokens"])
    chars = sum(len(str(m.content)) for m in sent) + len(str(ai.content)) + len(json.dumps(ai.tool_calls, default=str))
    return chars // 4 + 1


class LLMClient:
    """Asks roles' questions. ``chat_model`` (any langchain chat model with tool calling) replaces the
    ChatOpenAI built from the settings; ``workdir`` (the port's workspace) keeps the records and the
    budget's ledger, and gives the tools the model to read (``workdir/model``)."""

    def __init__(self, settings: LLMSettings | None = None, chat_model: BaseChatModel | None = None,
                 workdir: Path | None = None, toolbox: ToolBox | None = None) -> None:
        self.settings = settings or LLMSettings()
        self.workdir = workdir
        self._chat = chat_model
        model_dir = workdir / "model" if workdir else None
        self.toolbox = toolbox or ToolBox(
            model_dir=model_dir if model_dir and model_dir.is_dir() else None,
            scratch_dir=workdir / "llm_scratch" if workdir else None,
            max_chars=self.settings.tool_output_chars, sandbox_timeout_s=self.settings.sandbox_timeout_s,
            max_sandbox_calls=self.settings.max_sandbox_calls)
        self.budget = TokenBudget(self.settings.port_token_limit, workdir / "llm_usage.json" if workdir else None)
        self.records: list[dict[str, Any]] = []
        self.last_prompt_id: str | None = None
        self._agent = "llm"
        self._answer_name: str | None = None

    @property
    def available(self) -> bool:
        """An endpoint is configured, or a chat model was given."""
        return self._chat is not None or self.settings.configured

    def chat_model(self) -> BaseChatModel:
        if self._chat is None:
            s = self.settings
            if not s.configured:
                raise RuntimeError("no LLM is configured: set NPUPORT_LLM_BASE_URL and NPUPORT_LLM_MODEL")
            from langchain_openai import ChatOpenAI

            key = s.api_key.get_secret_value() if s.api_key else "not-needed"  # local servers ignore it
            self._chat = ChatOpenAI(model=s.model or "", base_url=s.base_url, api_key=key,  # type: ignore[arg-type]
                                    temperature=s.temperature, timeout=s.timeout_s, max_retries=s.max_retries,
                                    max_completion_tokens=s.max_completion_tokens, stream_usage=True)
        return self._chat

    @property
    def records_dir(self) -> Path | None:
        """Where every prompt and response of this port is saved (the bundle copies it as llm/)."""
        return self.workdir / "llm" if self.workdir and self.workdir.is_dir() else None

    # ------------------------------------------------------------------------------------- asking

    def ask(self, role: Role[A], question: str, check: Callable[[A], list[str]] | None = None) -> A:
        """One conversation: tools (when the role has them) until the model answers with the role's
        schema; invalid answers go back with the reasons. Raises BudgetExhausted or AnswerRejected."""
        from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

        schema, agent = role.schema, role.name
        self._agent, self._answer_name = agent, schema.__name__
        model = self.chat_model()
        check_answer = check or (lambda _a: [])
        messages: list[BaseMessage] = [SystemMessage(load_prompt(agent)), HumanMessage(question)]
        answer_name = schema.__name__
        rejected = 0
        problems: list[str] = []
        if role.tools:
            bound = model.bind_tools([*self.toolbox.openai_tools(), schema])
            for _ in range(self.settings.max_tool_rounds):
                ai = self._invoke(bound, messages)
                messages.append(ai)
                if not ai.tool_calls and not ai.invalid_tool_calls:
                    break
                for bad in ai.invalid_tool_calls:
                    why = f"the arguments of {bad.get('name')} are not valid JSON"
                    if bad.get("name") == answer_name:  # a malformed answer counts against the retries
                        rejected += 1
                        problems = [why]
                        messages.append(ToolMessage(rejection(problems), tool_call_id=bad.get("id") or ""))
                        think(agent, "llm", f"npuport rejected the answer: {why}", prompt=self.last_prompt_id)
                        continue
                    messages.append(ToolMessage(f"error: {why}", tool_call_id=bad.get("id") or ""))
                for call in ai.tool_calls:
                    if call["name"] != answer_name:
                        messages.append(ToolMessage(self.toolbox.run(call["name"], call["args"]),
                                                    tool_call_id=call["id"] or ""))
                        continue
                    answer, problems = parse_answer(schema, call["args"], check_answer)
                    if answer is not None:
                        return answer
                    rejected += 1
                    messages.append(ToolMessage(rejection(problems), tool_call_id=call["id"] or ""))
                    think(agent, "llm", f"npuport rejected the answer: {'; '.join(problems)}",
                          prompt=self.last_prompt_id)
                if rejected > self.settings.max_answer_retries:
                    raise AnswerRejected("; ".join(problems))
        return self._structured(schema, messages, check_answer)

    def _structured(self, schema: type[A], messages: list[BaseMessage], check: Callable[[A], list[str]]) -> A:
        """The model stopped calling tools (or used up its rounds, or has none): ask for the structured answer."""
        from langchain_core.messages import HumanMessage, ToolMessage

        answer_name = schema.__name__
        structured = self.chat_model().with_structured_output(schema, method=self.settings.structured_method,
                                                              include_raw=True)
        messages.append(HumanMessage(f"Give your answer now as {answer_name}."))
        problems: list[str] = []
        for _ in range(self.settings.max_answer_retries + 1):
            self.budget.check()
            try:
                out = cast(dict[str, Any], structured.invoke(messages))  # include_raw: raw, parsed, parsing_error
            except Exception as exc:
                self._failed(messages, exc)
                raise
            raw = out["raw"]
            tokens = tokens_of(raw, messages)
            self.budget.add(tokens)
            self._record(messages, raw, tokens)
            self._think_turn(raw, tokens)
            parsed = out.get("parsed")
            if parsed is not None:
                answer, problems = parse_answer(schema,
                                                parsed.model_dump() if isinstance(parsed, BaseModel) else parsed,
                                                check)
                if answer is not None:
                    return answer
            elif raw.invalid_tool_calls:
                bad = raw.invalid_tool_calls[0]
                problems = [f"the arguments of {bad.get('name')} are not valid JSON "
                            f"({str(bad.get('error') or '')[:200] or 'cannot parse'})"]
            else:
                problems = [f"the answer does not match {answer_name}: {str(out.get('parsing_error'))[:300]}"]
            messages.append(raw)
            think(self._agent, "llm", f"npuport rejected the answer: {'; '.join(problems)}", prompt=self.last_prompt_id)
            if raw.tool_calls:
                messages.extend(ToolMessage(rejection(problems), tool_call_id=c["id"] or "") for c in raw.tool_calls)
            else:
                messages.append(HumanMessage(rejection(problems)))
        raise AnswerRejected("; ".join(problems))

    def _invoke(self, runnable: Any, messages: list[BaseMessage]) -> AIMessage:
        self.budget.check()
        try:
            ai = runnable.invoke(messages)
        except Exception as exc:
            self._failed(messages, exc)
            raise
        tokens = tokens_of(ai, messages)
        self.budget.add(tokens)
        self._record(messages, ai, tokens)
        self._think_turn(ai, tokens)
        return ai

    def _failed(self, messages: list[BaseMessage], exc: Exception) -> None:
        self._record(messages, None, 0, error=f"{type(exc).__name__}: {first_line(exc, 300)}")
        think(self._agent, "llm", f"the LLM call failed: {why_failed(exc)}", prompt=self.last_prompt_id)

    def _think_turn(self, ai: AIMessage, tokens: int) -> None:
        """The turn as live progress (the chat API and the job stream show it)."""
        reasoning = (ai.additional_kwargs or {}).get("reasoning_content")  # reasoning models behind vLLM and others
        calls: list[dict[str, Any]] = [{"name": c["name"], "args": c["args"]} for c in ai.tool_calls]
        calls += [{"name": c.get("name"), "args": {"invalid arguments": str(c.get("args"))[:120]}}
                  for c in ai.invalid_tool_calls]
        think(self._agent, "llm", llm_turn_text(ai.content, calls, self._answer_name, reasoning),
              prompt=self.last_prompt_id, tokens=tokens)

    def _record(self, sent: Sequence[BaseMessage], ai: AIMessage | None, tokens: int, error: str | None = None) -> None:
        """Save one exchange (secrets scrubbed) as llm/<n>-<agent>.json; its stem is the prompt id that
        commits and diagnoses cite. Without a workspace (the planner) the exchange is kept in memory."""
        n = len(self.records) + 1
        folder = self.records_dir
        if folder is not None:
            folder.mkdir(exist_ok=True)
            n = len(list(folder.glob("*.json"))) + 1
        pid = f"{n:03d}-{self._agent}"
        usage = dict(ai.usage_metadata or {}) if ai is not None else {}
        secrets = self._secrets()
        rec = {"id": pid, "agent": self._agent, "model": self.settings.model, "tokens": tokens, "usage": usage,
               "budget": {"used": self.budget.used, "limit": self.budget.limit}, "error": error,
               "messages": [scrub(message_dict(m), secrets) for m in sent],
               "response": scrub(message_dict(ai), secrets) if ai is not None else None}
        self.records.append(rec)
        self.last_prompt_id = pid
        if folder is not None:
            (folder / f"{pid}.json").write_text(json.dumps(rec, indent=1, default=str), encoding="utf-8")

    def _secrets(self) -> list[str]:
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return [key] if len(key) >= 4 else []


def save_records(workdir: Path, records: list[dict[str, Any]]) -> None:
    """Write exchanges made before the workspace existed (the planner's) under <workdir>/llm/."""
    folder = workdir / "llm"
    folder.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (folder / f"{rec['id']}.json").write_text(json.dumps(rec, indent=1, default=str), encoding="utf-8")


_SECRET_PATTERNS = (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
                    re.compile(r"(?i)\b(api[_-]?key|token|secret|password)(\s*[=:]\s*)['\"]?[^\s'\",]{4,}"))


def scrub(data: Any, secrets: list[str]) -> Any:
    """The record with secrets replaced: the configured key, and key-looking strings (sk-..., bearer
    tokens, key=... assignments) the model may have read from a file."""
    if isinstance(data, dict):
        return {k: scrub(v, secrets) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub(v, secrets) for v in data]
    if isinstance(data, str):
        for s in secrets:
            data = data.replace(s, "[scrubbed]")
        for pat in _SECRET_PATTERNS:
            data = pat.sub(lambda m: (m.group(1) + m.group(2) + "[scrubbed]") if m.lastindex else "[scrubbed]", data)
        return data
    return data


def message_dict(m: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.type, "content": m.content}
    calls = getattr(m, "tool_calls", None)
    if calls:
        out["tool_calls"] = [{"name": c["name"], "args": c["args"], "id": c.get("id")} for c in calls]
    if getattr(m, "tool_call_id", None):
        out["tool_call_id"] = m.tool_call_id  # type: ignore[attr-defined]
    return out


def parse_answer(schema: type[A], args: Any, check: Callable[[A], list[str]]) -> tuple[A | None, list[str]]:
    """The answer as the schema's record and the check's problems (an edit that does not apply is one)."""
    try:
        answer = schema.model_validate(args)
    except ValidationError as exc:
        return None, [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]]
    try:
        problems = check(answer)
    except LLMEditError as exc:
        problems = [str(exc)]
    return (answer, []) if not problems else (None, problems)


def rejection(problems: list[str]) -> str:
    return "rejected: " + "; ".join(problems) + ". Fix these and answer again."
