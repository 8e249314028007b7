"""/healthz: liveness without auth (load balancers, `langgraph dev` checks)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(request: Request) -> dict[str, Any]:
    mgr = request.app.state.manager
    return {"ok": True, "service": "npuport", "workers": mgr.settings.workers,
            "jobs_active": mgr.store.count(("queued", "running"))}
