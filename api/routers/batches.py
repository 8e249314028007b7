"""/v1/batches: batch ports (create, list, status with the results table, events over SSE).

Owner rules as for ports (one function, ``api.auth.can_see``, serves both): a batch belongs to the token
that created it; other tokens get 404 for it and do not see it in lists; an ``admin`` token sees every batch.
The driver runs in a thread of the service; ports run on the executor the body names."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError, field_validator
from sse_starlette.sse import EventSourceResponse

from api.auth import Principal, can_see, owner_filter, require
from api.uploads import confine_model_path
from knowledge.errors import UploadError

router = APIRouter(prefix="/v1/batches", tags=["batches"])

Reader = Annotated[Principal, Depends(require("read"))]
Writer = Annotated[Principal, Depends(require("write"))]


class BatchCreate(BaseModel):
    manifest: dict[str, Any] = Field(
        description="the batch manifest (docs/batch.md) as JSON; model paths are folders under the allowed roots",
        examples=[{"name": "zoo", "defaults": {"target": "cpu"}, "models": [{"path": "ocr_mini"}]}])
    executor: Literal["local", "ray"] = Field(default="local", description="local: the service's worker pool; ray: "
                                              "the operator's Ray cluster (RAY_ADDRESS of the service), if it set one")
    ray_address: str | None = Field(default=None, description="refused: the Ray cluster is the operator's setting "
                                    "(RAY_ADDRESS of the service), never a client's")

    @field_validator("ray_address")
    @classmethod
    def _no_client_cluster(cls, v: str | None) -> str | None:
        # Ray Client exchanges pickles with whatever answers, and ray.init is process-global: every owner's
        # batches would follow a client-chosen address.
        if v:
            raise ValueError("ray_address is an operator setting (RAY_ADDRESS of the service), not a request field")
        return None
    workers: int | None = Field(default=None, ge=1, le=64, description="ports at once; at most the operator's "
                                "cap (NPUPORT_BATCH_WORKERS, else NPUPORT_WORKERS): it may only lower it")
    retry_failed: bool = False


@contextlib.contextmanager
def _store(request: Request) -> Iterator[Any]:
    from graph.batch.store import BatchStore

    home: Path = request.app.state.settings.resolved_home()
    store = BatchStore(home / "batches.sqlite")
    try:
        yield store
    finally:
        store.close()


def _owned(store: Any, batch_id: str, principal: Principal) -> Any:
    batch = store.batch(batch_id)
    if batch is None or not can_see(principal, batch.owner):
        raise HTTPException(status_code=404, detail=f"no batch {batch_id}")
    return batch


def _out(store: Any, batch: Any) -> dict[str, Any]:
    ports = store.ports(batch.id)
    results = None
    res_json = Path(batch.out_dir) / "results.json"
    if batch.status == "done" and res_json.is_file():
        results = json.loads(res_json.read_text())["ports"]
    return {"id": batch.id, "name": batch.name, "status": batch.status, "created": batch.created,
            "updated": batch.updated,
            "ports": [{"model": p.key, "status": p.status, "attempts": p.attempts, "reason": p.reason}
                      for p in ports],
            "counts": {s: sum(1 for p in ports if p.status == s) for s in ("queued", "running", "validated", "failed")},
            "results": results, "events_url": f"/v1/batches/{batch.id}/events"}


def _resolve(body: BatchCreate, principal: Principal, roots: list[Path]) -> Any:
    from graph.batch.manifest import BatchManifest, resolve
    from knowledge.errors import BatchManifestError

    try:
        manifest = BatchManifest.model_validate(body.manifest)
    except ValidationError as exc:
        raise HTTPException(status_code=422,
                            detail=json.loads(exc.json(include_url=False, include_input=False))) from exc
    for m in manifest.models:
        try:  # the same confinement as /v1/ports: a folder under an allowed root, symlinks resolved
            m.path = str(confine_model_path(m.path, roots))
        except UploadError as exc:
            raise HTTPException(status_code=exc.status_code, detail=f"{m.path}: {exc}") from exc
    try:
        resolved = resolve(manifest, Path("/"))
    except BatchManifestError as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from exc
    return resolved.model_copy(update={"owner": principal.name})


def _drive(resolved: Any, opts: Any, cancels: dict[str, threading.Event]) -> None:
    from graph.batch.runner import run_batch
    from knowledge.errors import BatchBusy

    try:
        with contextlib.suppress(BatchBusy):  # a twin request already drives it
            run_batch(resolved, opts)
    finally:
        cancels.pop(resolved.batch_id, None)


def _options(body: BatchCreate, request: Request, principal: Principal, stop: threading.Event) -> Any:
    """How the service runs a batch: in its own worker pool (at most the operator's cap of ports at once; a
    request may only lower it), or on the operator's Ray cluster when it set one; cancelled by ``stop``."""
    import os

    from graph.batch.runner import BatchOptions

    settings = request.app.state.settings
    cap = settings.batch_workers or settings.workers
    workers = min(body.workers or cap, cap)
    if body.executor == "ray":
        if not os.environ.get("RAY_ADDRESS"):
            raise HTTPException(status_code=422, detail="executor ray: the service has no Ray cluster (its operator's "
                                "RAY_ADDRESS); batches run in the service's worker pool (executor local)")
        return BatchOptions(executor="ray", ray_address=None, workers=workers, retry_failed=body.retry_failed,
                            owner=principal.name, should_stop=stop.is_set)
    return BatchOptions(executor="pool", workers=workers, retry_failed=body.retry_failed, owner=principal.name,
                        pool_submit=request.app.state.manager.pool_submit, should_stop=stop.is_set)


def _cancels(request: Request) -> dict[str, threading.Event]:
    state = request.app.state
    if not hasattr(state, "batch_cancels"):
        state.batch_cancels = {}
    return state.batch_cancels  # type: ignore[no-any-return]


@router.post("", status_code=201, responses={200: {"description": "the batch existed: resumed"},
                                              403: {"description": "a model outside the allowed roots"},
                                              422: {"description": "invalid manifest"}})
def create_batch(body: BatchCreate, request: Request, principal: Writer) -> JSONResponse:
    """Start (or resume: the same manifest from the same token is the same batch) a batch of ports."""
    from api.shares import memory_problem
    from graph.batch.runner import register

    settings = request.app.state.settings
    if problem := memory_problem(settings):
        raise HTTPException(status_code=503, detail=problem)
    resolved = _resolve(body, principal, settings.allowed_roots)
    home: Path = settings.resolved_home()
    stop = threading.Event()
    opts = _options(body, request, principal, stop)
    with _store(request) as store:
        existed = store.batch(resolved.batch_id) is not None
        bid, _ = register(resolved, principal.name, home / "batches" / resolved.batch_id / "out", store)
        batch = store.batch(bid)
        cancels = _cancels(request)
        if bid not in cancels:  # not driven now (a twin request's driver would hold the lock anyway)
            cancels[bid] = stop
            threading.Thread(target=_drive, args=(resolved, opts, cancels), name=f"npuport-batch-{bid}",
                             daemon=True).start()
        payload = _out(store, batch)
    return JSONResponse(payload, status_code=200 if existed else 201, headers={"Location": f"/v1/batches/{bid}"})


@router.post("/{batch_id}/cancel", responses={404: {"description": "unknown batch (or another token's)"},
                                               409: {"description": "the batch is not running"}})
def cancel_batch(batch_id: str, request: Request, principal: Writer) -> dict[str, Any]:
    """Cancel a batch: no port of it starts any more; those running stop (their sandbox runs are killed) and
    fail as cancelled, as do those not started."""
    with _store(request) as store:
        batch = _owned(store, batch_id, principal)
        stop = _cancels(request).get(batch_id)
        if stop is None or batch.status in ("done", "cancelled"):
            raise HTTPException(status_code=409, detail=f"batch {batch_id} is not running ({batch.status})")
        stop.set()
        store.add_event(batch_id, "batch", {"status": "cancelling", "reason": "cancelled by the user"})
        return _out(store, store.batch(batch_id))


@router.get("")
def list_batches(request: Request, principal: Reader,
                 limit: Annotated[int, Query(ge=1, le=500)] = 50) -> list[dict[str, Any]]:
    with _store(request) as store:
        return [_out(store, b) for b in store.list_batches(owner=owner_filter(principal), limit=limit)]


@router.get("/{batch_id}", responses={404: {"description": "unknown batch (or another token's)"}})
def get_batch(batch_id: str, request: Request, principal: Reader) -> dict[str, Any]:
    """Status per port; once done, the results table (the rows of results.json)."""
    with _store(request) as store:
        return _out(store, _owned(store, batch_id, principal))


@router.get("/{batch_id}/events", responses={
    200: {"description": "text/event-stream (`id` = seq), or a JSON list with stream=false",
          "content": {"text/event-stream": {}, "application/json": {}}},
    404: {"description": "unknown batch"}})
async def batch_events(batch_id: str, request: Request, principal: Reader,
                       last_event_id: Annotated[str | None, Header()] = None,
                       after: Annotated[int | None, Query(ge=0)] = None,
                       stream: Annotated[bool, Query()] = True) -> Any:
    """The batch's events: ``batch`` status changes, ``port`` status changes, agent ``step``s (with the
    model). The stream ends with ``end`` once the batch is done; reconnect with Last-Event-ID."""
    with _store(request) as store:
        _owned(store, batch_id, principal)
        given = (last_event_id or "").strip()
        start = after if after is not None else (int(given) if given.isdigit() else 0)
        if not stream:
            return store.events(batch_id, after=start, limit=100_000)
    return EventSourceResponse(_stream(request, batch_id, start), ping=10, send_timeout=30)


async def _stream(request: Request, batch_id: str, last: int) -> AsyncIterator[dict[str, Any]]:
    while True:
        with _store(request) as store:
            events = store.events(batch_id, after=last)
            batch = store.batch(batch_id)
        for e in events:
            yield {"id": str(e["seq"]), "event": e["kind"], "data": json.dumps(e)}
            last = e["seq"]
        if batch is not None and batch.status in ("done", "cancelled") and not events:
            yield {"event": "end", "data": json.dumps({"status": batch.status})}
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.5)
