"""``GET /v1/ports/{id}/pending``: the diff a job waiting for approval would commit next (and what it
has committed so far), so a reviewer approves a patch, not a promise."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from api.auth import Principal, require
from api.routers.ports import Manager, get_job

router = APIRouter(prefix="/v1/ports", tags=["ports"])
Reader = Annotated[Principal, Depends(require("read"))]


class Pending(BaseModel):
    id: str
    status: str
    applied: str
    """git diff of the patches committed so far (original..HEAD)."""
    pending: list[dict[str, Any]]
    """The patch records the next round would commit."""
    pending_diff: str
    note: str


@router.get("/{job_id}/pending", response_model=Pending, responses={404: {"description": "unknown job"}})
async def pending(job_id: str, principal: Reader, mgr: Manager) -> Pending:
    from graph.review import pending_patches

    job = get_job(mgr, job_id, principal)  # 404 unless the token owns the job (or is admin)
    out = await asyncio.to_thread(pending_patches, job_id, mgr.home / "checkpoints.sqlite", mgr.builder)
    return Pending(id=job_id, status=job.status, **out)
