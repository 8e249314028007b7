"""/v1/ports: porting jobs (create, list, status, events over SSE, report, bundle, approve, cancel)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from sse_starlette.sse import EventSourceResponse

from agents.request import request_fields
from api.auth import Principal, can_see, owner_filter, require
from api.jobs import STATUSES, TERMINAL, Job, JobManager
from api.submit import submit_job
from knowledge.errors import JobError, SubmitError

router = APIRouter(prefix="/v1/ports", tags=["ports"])

Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]


class _RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_out_dir(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("out_dir") is not None:
            raise ValueError("out_dir is chosen by the server (the bundle is served at /v1/ports/{id}/bundle)")
        return data


class RequestFields(create_model("_RequestFields", __base__=_RequestBody,  # type: ignore[misc]
                                 **request_fields(exclude=("out_dir",), partial=True))):
    """agents.request.PortRequest's fields, each optional (the goal or PortRequest's default fills one left
    out); out_dir is chosen by the server."""


class PortCreate(BaseModel):
    """A porting job. Give a goal in words, structured request fields, or both (fields win)."""

    goal: str = Field(default="", max_length=4000,
                      examples=["port the model in examples/ocr_mini to Ascend 910B on the cpu"])
    request: RequestFields = Field(
        default_factory=RequestFields, description="agents.request.PortRequest fields: model_path (under an "
                                                   "allowed root), target, chip, ...",
        examples=[{"model_path": "examples/ocr_mini", "target": "cpu"}])
    require_approval: bool = Field(default=False, description="pause before each patch round until approved")

    def request_values(self) -> dict[str, Any]:
        """The request fields the client sent."""
        return self.request.model_dump(exclude_none=True)


class JobOut(BaseModel):
    id: str
    status: Literal[STATUSES]  # type: ignore[valid-type]
    reason: str
    goal: str
    request: dict[str, Any]
    require_approval: bool
    created: float
    updated: float
    conversation: str | None
    steps: int
    events_url: str
    bundle_url: str | None


async def manager_of(request: Request) -> JobManager:
    mgr: JobManager = request.app.state.manager
    mgr.start(asyncio.get_running_loop())
    return mgr


Manager = Annotated[JobManager, Depends(manager_of)]


def job_out(mgr: JobManager, job: Job) -> dict[str, Any]:
    return job.public(mgr.store.step_count(job.id))


def get_job(mgr: JobManager, job_id: str, principal: Principal) -> Job:
    """The job, if ``principal`` owns it or holds the admin scope; otherwise 404 (existence is not told)."""
    job = mgr.store.get(job_id)
    if job is None or not can_see(principal, job.owner):
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    return job


def _inlined_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its nested models inlined: the OpenAPI document of the route has no
    ``$defs`` of its own to resolve ``#/$defs/...`` against (a client generator would fail on it)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline({**defs[ref.removeprefix("#/$defs/")], **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return inline(schema)


_CREATE_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _inlined_schema(PortCreate)},
            "multipart/form-data": {"schema": {
                "type": "object",
                "properties": {
                    "archive": {"type": "string", "format": "binary",
                                "description": "the model folder as .zip, .tar or .tar.gz"},
                    "goal": {"type": "string"},
                    "request": {"type": "string", "description": "JSON object of PortRequest fields"},
                    "require_approval": {"type": "boolean"},
                },
                "required": ["archive"],
            }},
        },
    },
}


@router.post("", status_code=201, response_model=JobOut, openapi_extra=_CREATE_DOC,
             responses={200: {"description": "replay of an earlier submission with the same Idempotency-Key"},
                        400: {"description": "malformed body or archive"}, 403: {"description": "path outside roots"},
                        409: {"description": "Idempotency-Key reused for another body"},
                        413: {"description": "body or archive too large"}, 422: {"description": "invalid request"},
                        429: {"description": "queue full"}})
async def create_port(request: Request, principal: Writer, mgr: Manager,
                      idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> JSONResponse:
    """Start a porting job. JSON body (``PortCreate``) with a model folder under an allowed root, or
    ``multipart/form-data`` with the model as an ``archive`` file. Send ``Idempotency-Key`` to make
    retries safe: the same key and body return the first job (200)."""
    ctype = request.headers.get("content-type", "")
    archive: tuple[bytes, str] | None = None
    if ctype.startswith("multipart/form-data"):
        body, archive = await _read_multipart(request)
        digest_of: Any = {**body.model_dump(), "archive": hashlib.sha256(archive[0]).hexdigest()}
    else:
        raw = await request.body()
        try:
            payload = _loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise HTTPException(status_code=400, detail=f"malformed JSON body: {exc}") from exc
        body = _parse_body(payload)
        digest_of = body.model_dump()
    fields = body.request_values()
    if not body.goal.strip() and not fields.get("model_path") and archive is None:
        raise HTTPException(status_code=422, detail="give a goal, request.model_path, or an uploaded archive")
    try:
        job, created = await asyncio.to_thread(
            submit_job, mgr, owner=principal.name, goal=body.goal, fields=fields,
            require_approval=body.require_approval, archive=archive, idem_key=idempotency_key, digest_of=digest_of)
    except SubmitError as exc:
        raise HTTPException(status_code=exc.status_code, detail=str(exc)) from exc
    except JobError as exc:
        raise HTTPException(status_code=exc.status_code, detail=str(exc)) from exc
    headers = {"Location": f"/v1/ports/{job.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(job_out(mgr, job), status_code=201 if created else 200, headers=headers)


MAX_JSON_DEPTH = 32
MAX_JSON_NUMBER = 1e12  # no field of a request needs more; larger ones overflow timers and budgets


def _reject_constant(name: str) -> Any:
    raise HTTPException(status_code=422, detail=f"{name} is not a valid number here")


def _loads(raw: bytes | str) -> Any:
    """json.loads that answers 422 for NaN/Infinity and for nesting too deep to parse."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        raise HTTPException(status_code=422, detail="the JSON body is nested too deeply") from None


def _check_values(value: Any, depth: int = 0) -> None:
    if depth > MAX_JSON_DEPTH:
        raise HTTPException(status_code=422, detail=f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, bool):
        return
    if isinstance(value, int | float) and (value != value or abs(value) > MAX_JSON_NUMBER):
        raise HTTPException(status_code=422, detail=f"number {value!r} is out of range (|x| <= {MAX_JSON_NUMBER:g})")
    if isinstance(value, dict):
        for v in value.values():
            _check_values(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_values(v, depth + 1)


def _parse_body(payload: Any) -> PortCreate:
    if not isinstance(payload, dict):
        raise HTTPException(status_code=422, detail="the body must be a JSON object")
    _check_values(payload)
    try:
        return PortCreate.model_validate(payload)
    except ValidationError as exc:
        raise HTTPException(status_code=422,
                            detail=json.loads(exc.json(include_url=False, include_input=False))) from exc


async def _read_multipart(request: Request) -> tuple[PortCreate, tuple[bytes, str]]:
    settings = request.app.state.settings
    try:
        form = await request.form(max_files=1, max_fields=10, max_part_size=settings.max_body_bytes)
    except Exception as exc:
        limit = request.scope.get("npuport.body_limit")
        if limit is not None:  # the body cap tripped while the parser read: that is a 413, chunked or not
            raise limit from None
        if isinstance(exc, HTTPException):
            raise
        raise HTTPException(status_code=400, detail=f"malformed multipart body: {exc}") from exc
    upload = form.get("archive")
    if upload is None or isinstance(upload, str):
        raise HTTPException(status_code=422, detail="multipart body needs an 'archive' file field")
    data = await upload.read()
    if len(data) > settings.max_upload_bytes:
        raise HTTPException(status_code=413, detail=f"archive exceeds the cap of {settings.max_upload_bytes} bytes")
    fields: dict[str, Any] = {"goal": str(form.get("goal") or "")}
    if form.get("request"):
        try:
            fields["request"] = _loads(str(form.get("request")))
        except json.JSONDecodeError as exc:
            raise HTTPException(status_code=400, detail=f"malformed JSON in the 'request' field: {exc}") from exc
    fields["require_approval"] = str(form.get("require_approval") or "").lower() in ("1", "true", "yes", "on")
    return _parse_body(fields), (data, upload.filename or "upload")


@router.get("", response_model=list[JobOut])
def list_ports(principal: Reader, mgr: Manager, limit: Annotated[int, Query(ge=1, le=500)] = 50,
               status: Annotated[Literal[STATUSES] | None, Query()] = None) -> list[dict[str, Any]]:  # type: ignore[valid-type]
    """Recent jobs of this token (every job for an admin token), newest first."""
    return [job_out(mgr, j) for j in mgr.store.list_jobs(limit=limit, status=status, owner=owner_filter(principal))]


@router.get("/{job_id}", response_model=JobOut, responses={404: {"description": "unknown job"}})
def get_port(job_id: str, principal: Reader, mgr: Manager) -> dict[str, Any]:
    return job_out(mgr, get_job(mgr, job_id, principal))


def _event_dict(seq: int, kind: str, t: float, data: dict[str, Any]) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "t": t, "data": data}


@router.get("/{job_id}/events", responses={
    200: {"description": "text/event-stream of events (`id` = seq); or a JSON list with stream=false",
          "content": {"text/event-stream": {}, "application/json": {}}},
    404: {"description": "unknown job"}})
async def port_events(
    job_id: str, request: Request, principal: Reader, mgr: Manager,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[int | None, Query(ge=0, description="resume after this seq (like Last-Event-ID)")] = None,
    stream: Annotated[bool, Query(description="false: return the events so far as JSON")] = True,
) -> Any:
    """Server-sent events of the job: ``status`` changes and agent ``step``s, in order; the stream ends
    with an ``end`` event after a terminal status. Reconnect with ``Last-Event-ID`` (or ``after``) to
    continue where you stopped."""
    get_job(mgr, job_id, principal)
    start = after if after is not None else _parse_last_id(last_event_id)
    if not stream:
        return [_event_dict(e.seq, e.kind, e.t, e.data) for e in mgr.store.events(job_id, after=start, limit=100_000)]
    return EventSourceResponse(_event_stream(request, mgr, job_id, start), ping=10, send_timeout=30)


def _parse_last_id(value: str | None) -> int:
    if value is None or not value.strip():
        return 0
    try:
        n = int(value.strip())
    except ValueError:
        raise HTTPException(status_code=400, detail="Last-Event-ID must be an event seq (integer)") from None
    if n < 0:
        raise HTTPException(status_code=400, detail="Last-Event-ID must be >= 0")
    return n


async def _event_stream(request: Request, mgr: JobManager, job_id: str, last: int) -> AsyncIterator[dict[str, Any]]:
    wake = mgr.listen(job_id)
    lagging = 0
    try:
        while True:
            wake.clear()
            ended = False
            for e in mgr.store.events(job_id, after=last):
                yield {"id": str(e.seq), "event": e.kind, "data": json.dumps(_event_dict(e.seq, e.kind, e.t, e.data))}
                last = e.seq
                ended = e.kind == "status" and e.data.get("status") in TERMINAL
            done = _already_ended(mgr, job_id, last)
            # The job row turns terminal a moment before its terminal event is written: wait for the event
            # (a reconnecting client must get it), unless it never comes (a server killed in between).
            lagging = lagging + 1 if done is None else 0
            if ended or done or lagging > 3:
                job = mgr.store.get(job_id)
                yield {"event": "end", "data": json.dumps({"status": job.status if job else "unknown"})}
                return
            if await request.is_disconnected():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=2.0)
    finally:
        mgr.unlisten(job_id, wake)


def _already_ended(mgr: JobManager, job_id: str, last: int) -> bool | None:
    """True: the client already has the terminal event, nothing more will come. None: the job is
    terminal but its terminal event is not written yet. False: not ended."""
    job = mgr.store.get(job_id)
    if job is None or job.status not in TERMINAL:
        return False
    if mgr.store.events(job_id, after=last, limit=1):
        return False
    seen = mgr.store.events(job_id, after=0, limit=max(last, 1))
    if any(e.kind == "status" and e.data.get("status") in TERMINAL for e in seen):
        return True
    return None


@router.get("/{job_id}/report", responses={404: {"description": "unknown job"}, 409: {"description": "no report yet"}})
def port_report(job_id: str, principal: Reader, mgr: Manager) -> dict[str, Any]:
    """The final report: ``markdown`` (report.md) and ``json`` (report.json)."""
    bundle = _bundle_dir(get_job(mgr, job_id, principal))
    md, js = bundle / "report.md", bundle / "report.json"
    return {"id": job_id, "markdown": md.read_text() if md.is_file() else "",
            "json": json.loads(js.read_text()) if js.is_file() else None}


def _bundle_dir(job: Job) -> Path:
    if job.status not in TERMINAL or not job.bundle_dir or not Path(job.bundle_dir).is_dir():
        raise HTTPException(status_code=409, detail=f"job {job.id} has no bundle yet (status {job.status})")
    return Path(job.bundle_dir)


@router.get("/{job_id}/bundle", response_class=StreamingResponse,
            responses={200: {"content": {"application/zip": {}}}, 404: {"description": "unknown job"},
                       409: {"description": "the job has not finished"}})
def port_bundle(job_id: str, principal: Reader, mgr: Manager) -> StreamingResponse:
    """The deployment bundle (port.patch, report.md, report.json, trace.jsonl, ...) as a zip."""
    bundle = _bundle_dir(get_job(mgr, job_id, principal))
    spool = tempfile.SpooledTemporaryFile(max_size=16 * 1024 * 1024)  # noqa: SIM115 - closed by the stream
    with zipfile.ZipFile(spool, "w", zipfile.ZIP_DEFLATED) as zf:
        real = bundle.resolve()
        for root, _dirs, files in os.walk(bundle):
            for name in sorted(files):
                p = Path(root) / name
                # a bundle never points outside itself; skip links that would
                if p.is_symlink() and not p.resolve().is_relative_to(real):
                    continue
                zf.write(p, p.relative_to(bundle).as_posix())
    spool.seek(0)

    def chunks() -> Iterator[bytes]:
        with spool:
            while block := spool.read(1 << 16):
                yield block

    return StreamingResponse(chunks(), media_type="application/zip",
                             headers={"Content-Disposition": f'attachment; filename="npuport-{job_id}.zip"'})


@router.post("/{job_id}/approve", response_model=JobOut,
             responses={404: {"description": "unknown job"}, 409: {"description": "not waiting for approval"}})
def approve_port(job_id: str, principal: Writer, mgr: Manager) -> dict[str, Any]:
    """Approve the next patch round of a job created with ``require_approval`` (its owner or an admin)."""
    get_job(mgr, job_id, principal)
    try:
        return job_out(mgr, mgr.approve(job_id))
    except JobError as exc:
        raise HTTPException(status_code=exc.status_code, detail=str(exc)) from exc


@router.post("/{job_id}/cancel", response_model=JobOut,
             responses={404: {"description": "unknown job"}, 409: {"description": "the job already ended"}})
def cancel_port(job_id: str, principal: Writer, mgr: Manager) -> dict[str, Any]:
    """Cancel a job (its owner or an admin); a running one stops after its current agent step."""
    get_job(mgr, job_id, principal)
    try:
        return job_out(mgr, mgr.cancel(job_id))
    except JobError as exc:
        raise HTTPException(status_code=exc.status_code, detail=str(exc)) from exc
