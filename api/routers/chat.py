"""OpenAI-compatible ``POST /v1/chat/completions``: porting goals in chat, progress as assistant deltas.

A conversation is bound to its latest job. The conversation is named, in this order, by
``metadata.conversation_id``, by the ``user`` field, or (for clients that send neither) by the job
id quoted in an earlier assistant message of the history (every reply about a job quotes it as
``job `<id>```). Conversations are private to the token that made them.

What the last user message may say:
- a porting goal ("port the model in examples/ocr_mini to Ascend 910B on the cpu"): starts a job;
  streaming replies follow the agents until the job ends or waits for approval;
- "status" / "progress" (or anything else, once a job is bound): where the job stands;
- "report": the final report (report.md);
- "what did you change?", "why?", "what is left?": answered from the job's report.json (api/chat_answers.py);
- "cancel" / "stop"; "approve": steer the job (these and new goals need the write scope).

``metadata.policy`` ("rule", "llm" or "hybrid") chooses who decides for a new port; with an LLM policy
and a configured endpoint (NPUPORT_LLM_*) each agent's reasoning streams as it happens, as does the rule
policy's decision text. Those chunks carry ``npuport.event = "reasoning"`` with the agent and the source
(``llm`` or ``rules``), so a client can show them apart from the replies.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from api.auth import Principal, require
from api.chat_answers import answer, question_of
from api.jobs import TERMINAL, Job, JobManager
from api.routers.ports import manager_of
from api.submit import ROOTS_HINT, submit_job
from knowledge.errors import JobError, SubmitError

router = APIRouter(prefix="/v1", tags=["chat"])
MODEL_NAME = "npuport"
_JOB_REF = re.compile(r"job `([\w.-]+)`")


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(BaseModel):
    model: str = MODEL_NAME
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None

    model_config = {"extra": "allow"}  # temperature, max_tokens, ... are accepted and ignored


def _text(msg: ChatMessage) -> str:
    if isinstance(msg.content, str):
        return msg.content
    return " ".join(str(p.get("text", "")) for p in msg.content or [] if p.get("type") == "text")


def _conversation(body: ChatRequest, principal: Principal) -> str | None:
    meta = body.metadata or {}
    if meta.get("conversation_id"):
        return f"{principal.name}:conv:{meta['conversation_id']}"
    if body.user:
        return f"{principal.name}:user:{body.user}"
    return None


def _bound_job(mgr: JobManager, body: ChatRequest, conversation: str | None, owner: str) -> Job | None:
    job_id = mgr.store.conversation_job(conversation) if conversation else None
    if job_id is None:  # stateless clients: the job quoted in the history
        for m in reversed(body.messages):
            if m.role == "assistant" and (found := _JOB_REF.findall(_text(m))):
                job_id = found[-1]
                break
    job = mgr.store.get(job_id) if job_id else None
    return job if job is not None and job.owner == owner else None


def _intent(text: str, has_job: bool) -> str:
    t = text.lower()
    if has_job:
        for intent, pattern in (("cancel", r"\b(cancel|stop|abort)\b"), ("approve", r"\b(approve|go ahead)\b"),
                                ("report", r"\b(report|result|results)\b")):
            if re.search(pattern, t):
                return intent
        if question_of(t) and not re.search(r"\bport (the|a|my)\b", t):  # what changed / why / what is left
            return "question"
    if re.search(r"\bport\b", t):
        return "goal"
    return "status" if has_job else "help"


HELP = ("I port PyTorch models to Huawei Ascend NPUs. Tell me what to port, e.g. \"port the model in "
        "examples/ocr_mini to Ascend 910B on the cpu\". Then ask for status, the report, or say cancel / approve.")


async def _start_port(mgr: JobManager, body: ChatRequest, text: str, conversation: str | None,
                      principal: Principal) -> tuple[str, Job | None]:
    """A goal in the chat: the port it starts (the reply, the job to follow), or why it could not start."""
    try:
        fields = {"policy": policy} if (policy := (body.metadata or {}).get("policy")) else {}
        new_job, _ = await asyncio.to_thread(submit_job, mgr, owner=principal.name, goal=text, fields=fields,
                                             conversation=conversation)
        return (f"Started job `{new_job.id}`: port {Path(new_job.request['model_path']).name} "
                f"to {new_job.request['target']}.\n"), new_job
    except (SubmitError, JobError) as exc:
        reply = f"I could not start that port: {exc}"
        if not mgr.settings.allowed_roots:  # a chat client cannot upload: say how a folder becomes portable
            reply += f". To port a model folder by its path, {ROOTS_HINT}."
        return reply, None


def _act_on(mgr: JobManager, job: Job, intent: str) -> tuple[str, Job, Job | None, int]:
    """Cancel or approve the conversation's job: (the reply, the job, the job to follow, the event seq the
    reply streams after: an approval streams only what comes next)."""
    try:
        if intent == "cancel":
            job = mgr.cancel(job.id)
            return f"Cancel requested for job `{job.id}` (now {job.status}).", job, None, 0
        last_events = mgr.store.events(job.id, after=0, limit=100_000)
        follow_after = last_events[-1].seq if last_events else 0
        job = mgr.approve(job.id)
        return f"Approved job `{job.id}`; it continues.\n", job, job, follow_after
    except JobError as exc:
        return f"job `{job.id}`: {exc}", job, None, 0


@router.post("/chat/completions", responses={400: {"description": "no user message"},
                                             403: {"description": "the token lacks a scope the message needs"}})
async def chat_completions(body: ChatRequest, request: Request,
                           principal: Annotated[Principal, Depends(require("read"))],
                           mgr: Annotated[JobManager, Depends(manager_of)]) -> Any:
    """OpenAI-compatible chat completions (``stream`` true or false); see the module doc for the
    conversation rules."""
    users = [m for m in body.messages if m.role == "user"]
    if not users:
        raise HTTPException(status_code=400, detail="no user message")
    text = _text(users[-1]).strip()
    conversation = _conversation(body, principal)
    job = _bound_job(mgr, body, conversation, principal.name)
    intent = _intent(text, job is not None)
    if intent in ("goal", "cancel", "approve") and "write" not in principal.scopes:
        raise HTTPException(status_code=403, detail=f"this token lacks the 'write' scope needed to {intent}")
    follow: Job | None = None
    follow_after = 0  # the first event seq the reply streams after (approve: only what comes next)
    if intent == "goal":
        reply, follow = await _start_port(mgr, body, text, conversation, principal)
        job = follow or job
    elif job is None:
        reply = HELP
    elif intent in ("cancel", "approve"):
        reply, job, follow, follow_after = _act_on(mgr, job, intent)
    elif intent == "report":
        reply = _report_text(job)
    elif intent == "question":
        reply = answer(job, question_of(text) or "changed")
    else:
        reply = _status_text(mgr, job)
    if conversation and job is not None:
        mgr.store.bind_conversation(conversation, job.id)
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    extra = {"job_id": job.id if job else None, "conversation": conversation}
    if not body.stream:
        return JSONResponse(_completion(cid, reply, extra))
    return StreamingResponse(_stream(request, mgr, cid, reply, follow, extra, follow_after),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _status_text(mgr: JobManager, job: Job) -> str:
    steps = [e for e in mgr.store.events(job.id, limit=100_000) if e.kind == "step"]
    last = "; ".join(f"{e.data.get('agent')}: {e.data.get('summary')}" for e in steps[-3:]) or "no agent step yet"
    reason = f" — {job.reason}" if job.reason else ""
    return f"job `{job.id}` is {job.status}{reason}. {len(steps)} agent steps so far; latest: {last}"


def _report_text(job: Job) -> str:
    if job.status not in TERMINAL or not job.bundle_dir:
        return f"job `{job.id}` is {job.status}; the report is written when it ends."
    md = Path(job.bundle_dir) / "report.md"
    return f"Report of job `{job.id}`:\n\n" + (md.read_text() if md.is_file() else "(no report.md in the bundle)")


def _completion(cid: str, content: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": MODEL_NAME,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "npuport": extra}


def _chunk(cid: str, delta: dict[str, Any], finish: str | None = None, extra: dict[str, Any] | None = None) -> str:
    payload: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                               "model": MODEL_NAME, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if extra:
        payload["npuport"] = extra
    return f"data: {json.dumps(payload)}\n\n"


def _event_line(kind: str, data: dict[str, Any]) -> str | None:
    if kind == "step":
        return f"- **{data.get('agent')}**: {data.get('summary')}\n"
    if kind == "progress" and data.get("kind") == "reasoning":  # an agent thinking aloud (agents/reasoning.py)
        who = "LLM" if data.get("source") == "llm" else "rules"
        return f"  > _{data.get('agent')} ({who})_: {data.get('text')}\n"
    if kind == "progress" and data.get("kind") == "phase" and data.get("node") == "deployer":
        return f"  - _{data.get('text')}_\n"  # the deployment's named phases: env, start, tokens, throughput
    if kind == "progress" and data.get("kind") == "task" and data.get("node") == "deployer":
        return "- **deployment**: the bundle is written; vLLM now serves the port with serve.sh\n"
    if kind != "status":  # other live progress (node starts, trials) is for the page; chat gets the steps
        return None
    status = data.get("status")
    if status in ("queued", "running") and not data.get("reason"):
        return None
    return f"_status: {status}{' — ' + data['reason'] if data.get('reason') else ''}_\n"


async def _stream(request: Request, mgr: JobManager, cid: str, reply: str, follow: Job | None,
                  extra: dict[str, Any], follow_after: int = 0) -> AsyncIterator[str]:
    yield _chunk(cid, {"role": "assistant", "content": ""}, extra=extra)
    yield _chunk(cid, {"content": reply})
    if follow is not None:
        async for line, meta in _follow(request, mgr, follow.id, follow_after):
            yield line if line.startswith(":") else _chunk(cid, {"content": line}, extra=meta)
    yield _chunk(cid, {}, finish="stop")
    yield "data: [DONE]\n\n"


async def _follow(request: Request, mgr: JobManager, job_id: str,
                  after: int = 0) -> AsyncIterator[tuple[str, dict[str, Any] | None]]:
    """Lines about the job's events after seq ``after`` until it ends or waits for approval, each with
    what the chunk says about itself (reasoning: its agent and source); SSE comments keep idle links open."""
    last = after
    wake = mgr.listen(job_id)
    idle = 0.0
    try:
        while True:
            wake.clear()
            for e in mgr.store.events(job_id, after=last):
                last = e.seq
                if (line := _event_line(e.kind, e.data)) is not None:
                    yield line, _meta(e.kind, e.data)
                status = e.data.get("status") if e.kind == "status" else None
                if status in TERMINAL:
                    job = mgr.store.get(job_id)
                    yield (_final_line(job) if job else ""), None
                    return
                if status == "awaiting_approval":
                    yield f"job `{job_id}` waits for your approval: reply \"approve\" or \"cancel\".\n", None
                    return
            if await request.is_disconnected():
                return
            try:
                await asyncio.wait_for(wake.wait(), timeout=2.0)
                idle = 0.0
            except TimeoutError:
                idle += 2.0
                if idle >= 14.0:
                    idle = 0.0
                    yield ": keep-alive\n\n", None
    finally:
        mgr.unlisten(job_id, wake)


def _meta(kind: str, data: dict[str, Any]) -> dict[str, Any] | None:
    if kind == "progress" and data.get("kind") == "reasoning":
        return {"event": "reasoning", "agent": data.get("agent"), "source": data.get("source"),
                **({"prompt": data["prompt"]} if data.get("prompt") else {})}
    return None


def _final_line(job: Job) -> str:
    bundle = f" Bundle: /v1/ports/{job.id}/bundle; ask for the report." if job.bundle_dir else ""
    return f"\njob `{job.id}` ended: **{job.status}** — {job.reason}.{bundle}\n" + _deployment_line(job)


def _deployment_line(job: Job) -> str:
    """The deployment's outcome from the job's bundle (report.json), said in the last message."""
    from agents.deploy.serve_report import deployment_summary

    report = Path(job.bundle_dir) / "report.json" if job.bundle_dir else None
    try:
        record = json.loads(report.read_text()).get("deployment") if report and report.is_file() else None
    except (OSError, ValueError):
        record = None
    if not record:
        return ""
    return f"Deployment: {deployment_summary(record).replace('BUNDLE', f'the bundle ({job.bundle_dir})')}\n"
