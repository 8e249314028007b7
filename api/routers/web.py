"""The single-page web chat at / (static HTML + JS, no build step). The page itself needs no
token; it asks for one and sends it as a bearer token to the API."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

router = APIRouter(tags=["web"])
STATIC = Path(__file__).resolve().parents[1] / "static"


@router.get("/", include_in_schema=False)
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html",
                        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
