"""Service settings (pydantic-settings, env prefix ``NPUPORT_``).

Environment examples::

    NPUPORT_HOME=/srv/npuport
    NPUPORT_TOKENS='{"s3cret-admin": ["read", "write"], "s3cret-viewer": ["read"]}'
    NPUPORT_ALLOWED_ROOTS=/models:/data/models      # or a JSON list
    NPUPORT_WORKERS=2
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SCOPES = ("read", "write", "admin")
"""read: look at jobs, events, bundles, chat status questions; write: submit, approve, cancel;
admin: see every owner's batches."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NPUPORT_", extra="ignore")

    home: Path | None = None
    """The npuport home (job database, checkpoints, uploads, bundles); default ``~/.npuport``."""
    tokens: Annotated[dict[str, list[str]], NoDecode] = Field(default_factory=dict)
    """Bearer token -> scopes. With none configured every protected route answers 401."""
    allowed_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    """Model folders must resolve (symlinks followed) inside one of these; uploads are always allowed."""
    max_upload_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_extracted_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    max_archive_members: int = Field(default=10_000, gt=0)
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    """Cap of a non-upload request body (JSON)."""
    body_timeout_s: float = Field(default=15.0, gt=0)
    """A client that sends no body bytes for this long gets 408 (slow or stalled clients)."""
    workers: int = Field(default=2, ge=1, le=64)
    max_queued: int = Field(default=100, ge=1)

    @field_validator("tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            if not v:
                return {}
            if v.startswith("{"):
                return json.loads(v)
            # compact form: "tokenA=read+write,tokenB=read"
            out: dict[str, list[str]] = {}
            for part in v.split(","):
                tok, _, scopes = part.partition("=")
                out[tok.strip()] = [s for s in scopes.replace("+", " ").split() if s] or ["read", "write"]
            return out
        return v

    @field_validator("tokens")
    @classmethod
    def _check_scopes(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for tok, scopes in v.items():
            if not tok:
                raise ValueError("empty token")
            bad = set(scopes) - set(SCOPES)
            if bad:
                raise ValueError(f"unknown scopes {sorted(bad)}; known: {list(SCOPES)}")
        return v

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _parse_roots(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                return json.loads(v)
            return [p for p in v.split(os.pathsep) if p]
        return v

    def resolved_home(self) -> Path:
        home = (self.home or Path(os.environ.get("NPUPORT_HOME") or Path.home() / ".npuport")).expanduser()
        home.mkdir(parents=True, exist_ok=True)
        return home.resolve()
