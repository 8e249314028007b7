"""``langgraph dev`` / LangGraph Studio as one of npuport's front doors, under the policy of ``npuport serve``
(docs/security.md, "Front doors"): langgraph.json names this module's ``graph`` and ``auth``.

- **Tokens**: the bearer tokens of ``NPUPORT_TOKENS`` with their scopes (without them, the one token
  ``npuport serve`` keeps in the home, made once and printed); no token, no request: LangGraph's own routes
  answer 401, and Studio's unauthenticated "langsmith" scheme is off (``disable_studio_auth`` in
  langgraph.json). Studio sends the token as a header of its connection (``Authorization: Bearer ...``).
- **Owners**: a thread (and its runs and state: the model's source, read back) belongs to the token that made
  it; another token neither reads nor finds it. Writing (threads, runs, assistants, the store) needs ``write``.
- **Roots**: the graph this module serves runs in a process marked as a service (agents/doors.py), so the
  planner confines every port's model folder to ``NPUPORT_ALLOWED_ROOTS`` and its output to the home or a
  root, whatever the form or the goal text says.
- **Browsers**: CORS admits Studio's origins only (langgraph.json ``http.cors``); a POST whose body is not
  JSON is refused before LangGraph reads it (api/limits.py), so a web page's form cannot start a run.
"""

from __future__ import annotations

import sys
from typing import Any

from langgraph_sdk import Auth

from agents.doors import mark_service
from api.auth import Principal, principal_of
from knowledge.settings import ServiceSettings

mark_service()  # before the graph is built: every port this process runs is confined to the roots

from graph.builder import graph  # noqa: E402  (langgraph.json's "graphs" entry)

__all__ = ["auth", "graph"]

auth = Auth()
READS = frozenset({"read", "search", "get", "list_namespaces"})
_home_token_said = False


def _tokens() -> dict[str, list[str]]:
    """NPUPORT_TOKENS, else `npuport serve`'s token kept in the home (made once, said once on stderr)."""
    global _home_token_said
    settings = ServiceSettings()
    if settings.tokens:
        return settings.tokens
    from api.serve import home_token

    token, path, _ = home_token(settings.resolved_home())
    if not _home_token_said:
        _home_token_said = True
        print(f"npuport: langgraph dev takes the token kept in {path} (Authorization: Bearer <token>)",
              file=sys.stderr, flush=True)
    return {token: ["read", "write"]}


@auth.authenticate
async def authenticate(authorization: str | None) -> Auth.types.MinimalUserDict:
    try:
        principal: Principal = principal_of(_tokens(), authorization)
    except PermissionError as exc:
        raise Auth.exceptions.HTTPException(status_code=401, detail=str(exc),
                                            headers={"WWW-Authenticate": "Bearer"}) from None
    return {"identity": principal.name, "permissions": sorted(principal.scopes)}


@auth.on
async def owners_and_scopes(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType | None:
    """Writes need ``write``; threads (with their runs and state) and crons are their creator's (``admin`` sees
    all), as jobs are in the HTTP API; the graph's assistants are shared, read-only without ``write``."""
    scopes = set(ctx.permissions)
    if ctx.action not in READS and "write" not in scopes:
        raise Auth.exceptions.HTTPException(status_code=403, detail="this token lacks the 'write' scope")
    if ctx.resource not in ("threads", "crons", "runs"):
        return None
    if ctx.action == "create" and isinstance(value, dict):
        value.setdefault("metadata", {})
        if isinstance(value["metadata"], dict):
            value["metadata"]["owner"] = ctx.user.identity
    return None if "admin" in scopes else {"owner": ctx.user.identity}
