"""The npuport HTTP service (FastAPI): jobs with live events, OpenAI-compatible chat, the web page.

``create_app(settings)`` builds an app; the module-level ``app`` (settings from the environment)
is what ``uvicorn api.app:app`` and ``langgraph dev`` (langgraph.json ``http.app``) serve.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.jobs import JobManager, JobStore
from api.limits import BodyLimitMiddleware
from api.routers import batches, chat, health, ports, web
from api.settings import Settings

DESCRIPTION = """Port PyTorch models to Huawei Ascend NPUs as jobs.

Auth: `Authorization: Bearer <token>` on every route but `/healthz` and the web page; tokens and
their scopes (`read`, `write`) come from `NPUPORT_TOKENS`. See docs/api.md.
"""


def create_app(settings: Settings | None = None, *, graph_builder: Any = None) -> FastAPI:
    """Build the service. ``graph_builder`` swaps the port graph (tests of the API itself only)."""
    settings = settings or Settings()
    home = settings.resolved_home()
    # the graph (checkpoints, workspaces, matrices) reads the home from the environment
    os.environ["NPUPORT_HOME"] = str(home)
    store = JobStore(home / "service.sqlite")
    manager = JobManager(settings, store, builder=graph_builder)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        manager.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            manager.stop()

    app = FastAPI(title="npuport", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.settings = settings
    app.state.manager = manager
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_upload_bytes=settings.max_upload_bytes, timeout_s=settings.body_timeout_s)
    for r in (health.router, ports.router, batches.router, chat.router, web.router):
        app.include_router(r)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # a body that is not JSON at all is a 400 (malformed), a JSON body of the wrong shape a 422
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"detail": "malformed JSON body"}, status_code=400)
        return JSONResponse({"detail": _plain(errors)}, status_code=422)

    return app


def _plain(errors: Any) -> Any:
    return [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in errors]


_default: FastAPI | None = None


def __getattr__(name: str) -> Any:
    # ``app`` is built on first access, not at import: importing api.app must not open a database
    global _default
    if name == "app":
        if _default is None:
            _default = create_app()
        return _default
    raise AttributeError(name)
