"""The npuport HTTP service (FastAPI): jobs with live events, OpenAI-compatible chat, the web page.

``create_app(settings)`` builds an app; the module-level ``app`` (settings from the environment)
is what ``uvicorn api.app:app`` and ``langgraph dev`` (langgraph.json ``http.app``) serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from api import errors
from api.jobs import JobManager, JobStore
from api.limits import BodyLimitMiddleware
from api.routers import batches, catalog, chat, health, ports, review, web
from knowledge.settings import ServiceSettings as Settings
from knowledge.settings import set_environment

DESCRIPTION = """Port PyTorch models to Huawei Ascend NPUs as jobs.

Auth: `Authorization: Bearer <token>` on every route but `/healthz` and the web page; tokens and
their scopes (`read`, `write`) come from `NPUPORT_TOKENS`. See docs/api.md.

Errors: every route answers errors as `{"error": {"type", "message", "code"}, "detail"}`.
"""


def _fastapi(**kwargs: Any) -> FastAPI:
    """/docs and /redoc from assets shipped in a wheel (fastapi-offline), never from a CDN: Ascend
    clusters are often air-gapped."""
    from fastapi_offline import FastAPIOffline

    return FastAPIOffline(**kwargs)


def create_app(settings: Settings | None = None, *, graph_builder: Any = None) -> FastAPI:
    """Build the service. ``graph_builder`` swaps the port graph (tests of the API itself only)."""
    settings = settings or Settings()
    home = settings.resolved_home()
    # the graph (checkpoints, workspaces, matrices) reads the home from the environment
    set_environment({"NPUPORT_HOME": str(home)})
    store = JobStore(home / "service.sqlite")
    manager = JobManager(settings, store, builder=graph_builder)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            manager.stop()

    app = _fastapi(title="npuport", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.manager = manager
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_upload_bytes=settings.max_upload_bytes, timeout_s=settings.body_timeout_s)
    for r in (health.router, web.router):
        app.include_router(r)
    # review before ports: /v1/ports/{id}/pending must not be shadowed by a ports route
    for r in (review.router, ports.router, batches.router, chat.router, catalog.router):
        app.include_router(r, responses=errors.PROTECTED_RESPONSES)
    errors.install(app)
    return app


_default: FastAPI | None = None


def __getattr__(name: str) -> Any:
    # ``app`` is built on first access, not at import: importing api.app must not open a database
    global _default
    if name == "app":
        if _default is None:
            from agents.doors import mark_service

            mark_service()  # a process serving this app (uvicorn, langgraph dev): every port is confined
            _default = create_app()
        return _default
    raise AttributeError(name)
