"""One error body for every route: ``{"error": {"type", "message", "code"}, "detail": ...}``.

``error`` is the shape OpenAI clients parse; ``detail`` keeps what FastAPI clients read (a string, or
the list of validation problems for a 422). The body-limit middleware (api/limits.py) answers with the
same shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error", 409: "conflict_error",
         413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error", 500: "internal_error"}


class ErrorDetail(BaseModel):
    type: str
    """invalid_request_error, authentication_error, permission_error, not_found_error, conflict_error, ..."""
    message: str
    code: int
    """The HTTP status."""


class ErrorBody(BaseModel):
    error: ErrorDetail
    detail: Any = None


def error_body(status: int, detail: Any) -> dict[str, Any]:
    message = detail if isinstance(detail, str) else "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" if isinstance(e, dict) else str(e)
        for e in (detail if isinstance(detail, list) else [detail]))
    return {"error": {"type": TYPES.get(status, "error" if status < 500 else "internal_error"),
                      "message": message, "code": status}, "detail": detail}


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


PROTECTED_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _doc("missing or invalid bearer token (Authorization: Bearer <token>)"),
    403: _doc("the token lacks the scope this route needs"),
    422: _doc("invalid request"),
}
"""Added to every route behind auth, so OpenAPI documents 401/403 with the error schema."""


def _plain(errors: Any) -> Any:
    return [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in errors]


def install(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, exc.detail), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # a body that is not JSON at all is a 400 (malformed), a JSON body of the wrong shape a 422
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse(error_body(400, "malformed JSON body"), status_code=400)
        return JSONResponse(error_body(422, _plain(errors)), status_code=422)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}"), status_code=500)
