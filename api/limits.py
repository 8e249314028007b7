"""Request-body limits as ASGI middleware: a size cap (413) and a stall timeout (408).

The timeout guards the worker against slow or stalled clients: reading the body waits at most
``body_timeout_s`` for each chunk, then the request ends with 408 instead of hanging forever.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimitExceeded(HTTPException):
    """An HTTPException, so FastAPI's own body parsing passes it through unchanged."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(status_code=status, detail=detail, headers={"Connection": "close"})
        self.status = status


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, max_upload_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_body = max_body_bytes
        self.max_upload = max_upload_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if refused := _form_post(scope, headers):
            await _reply(send, 415, refused)
            return
        cap = self.max_upload if headers.get("content-type", "").startswith("multipart/") else self.max_body
        length = headers.get("content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _reply(send, 400, "invalid Content-Length")
                return
            if declared > cap:
                await _reply(send, 413, f"request body of {declared} bytes exceeds the cap of {cap} bytes")
                return
        received = 0
        started = False
        # A request that declares no body (a GET, an SSE stream) has nothing to time out: its later
        # receive() calls only wait for the disconnect, for as long as the response streams.
        body_done = (length is None or length.strip() == "0") and "transfer-encoding" not in headers

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done or started:  # after the body only a disconnect can come: wait as long as it takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), timeout=self.timeout_s)
            except TimeoutError:
                raise BodyLimitExceeded(408, f"no request body data for {self.timeout_s:g} s; closing") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    exc = BodyLimitExceeded(413, f"request body exceeds the cap of {cap} bytes")
                    scope["npuport.body_limit"] = exc  # parsers may wrap it (multipart: "malformed"); say 413
                    raise exc
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyLimitExceeded as exc:
            if not started:
                await _reply(send, exc.status, exc.detail)


BODY_TYPES = ("application/json", "multipart/form-data")
"""What a request with a body may send. A web page may POST text/plain or a urlencoded form to any origin
without asking (a CORS "simple" request); LangGraph's routes read any body as JSON, so such a POST is refused
here (an upload is multipart, which a page may send too: every route behind it asks for a bearer token)."""


def _form_post(scope: Scope, headers: dict[str, str]) -> str:
    """Why a request with a body of another type is refused (415), or ""."""
    if scope.get("method") not in ("POST", "PUT", "PATCH"):
        return ""
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    has_body = headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers
    if not has_body or kind in BODY_TYPES or kind.endswith("+json"):
        return ""
    return f"a request body of type {kind or 'none'} is refused; send application/json (or multipart/form-data)"


async def _reply(send: Send, status: int, detail: str) -> None:
    from api.errors import error_body

    body = json.dumps(error_body(status, detail)).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                          (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
