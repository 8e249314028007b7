"""Bearer-token auth: 401 without a known token, 403 for a known token lacking the scope."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from knowledge.settings import ServiceSettings as Settings

bearer = HTTPBearer(auto_error=False, description="A token from NPUPORT_TOKENS; scopes read and write.")


@dataclass(frozen=True)
class Principal:
    name: str
    """A stable, non-secret id of the token (its digest prefix): job owner and idempotency scope."""
    scopes: frozenset[str]


def can_see(principal: Principal, owner: str) -> bool:
    """The one owner rule for everything a token creates (ports, batches): its creator's token sees it,
    and so does a token with the ``admin`` scope; to anyone else it does not exist (404, not in lists)."""
    return principal.name == owner or "admin" in principal.scopes


def owner_filter(principal: Principal) -> str | None:
    """The owner to filter lists by under the same rule: None (every owner) for an admin."""
    return None if "admin" in principal.scopes else principal.name


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def principal_of(tokens: dict[str, list[str]], authorization: str | None) -> Principal:
    """The principal of an ``Authorization: Bearer <token>`` header under ``tokens``; PermissionError says why
    not. The one token check of every front door (the HTTP API, langgraph dev: api/studio.py)."""
    scheme, _, given_text = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given_text.strip():
        raise PermissionError("missing bearer token (Authorization: Bearer <token>)")
    given = given_text.strip().encode()
    found: list[str] | None = None
    for token, scopes in tokens.items():
        # compare every token in constant time so timing tells nothing about which one nearly matched
        if hmac.compare_digest(given, token.encode()):
            found = scopes
    if found is None:
        raise PermissionError("invalid bearer token")
    return Principal(name=hashlib.sha256(given).hexdigest()[:16], scopes=frozenset(found))


def authenticate(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    header = f"{credentials.scheme} {credentials.credentials}" if credentials is not None else None
    try:
        return principal_of(settings.tokens, header)
    except PermissionError as exc:
        raise _unauthorized(str(exc)) from None


def require(scope: str) -> Callable[..., Principal]:
    """A FastAPI dependency: the caller's principal, which must hold ``scope``."""

    def dependency(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
        principal = authenticate(request.app.state.settings, credentials)
        if scope not in principal.scopes:
            raise HTTPException(status_code=403, detail=f"this token lacks the '{scope}' scope")
        return principal

    return dependency
