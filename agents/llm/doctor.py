"""`npuport doctor`: what LLM endpoint is configured (key masked) and whether it answers.

Two probes, each with the configured timeout: ``GET <base>/models`` (the served models) and a one-token
chat completion with the configured model. The endpoint is healthy only when the chat call answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from knowledge.settings import LLMSettings

if TYPE_CHECKING:
    import httpx


class Probe(BaseModel):
    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


class LLMCheck(BaseModel):
    configured: bool
    settings: dict[str, Any] = Field(default_factory=dict)
    probes: list[Probe] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.configured and bool(self.probes) and all(p.ok for p in self.probes)


def mask(secret: str | None) -> str:
    """A key as it may be shown: its last four characters at most."""
    if not secret:
        return "(none)"
    return "****" + secret[-4:] if len(secret) > 8 else "****"


def shown_settings(s: LLMSettings) -> dict[str, Any]:
    key = s.api_key.get_secret_value() if s.api_key else None
    return {"base_url": s.base_url or "(none)", "model": s.model or "(none)", "api_key": mask(key),
            "temperature": s.temperature, "timeout_s": s.timeout_s, "max_retries": s.max_retries,
            "max_completion_tokens": s.max_completion_tokens, "token_budget": s.token_budget,
            "max_cost_usd": s.max_cost_usd, "usd_per_million_tokens": s.usd_per_million_tokens,
            "port_token_limit": s.port_token_limit, "structured_method": s.structured_method}


def _probe(name: str, call: Callable[[], httpx.Response], answered: Callable[[httpx.Response], str | None]) -> Probe:
    """One timed request: ok with ``answered``'s detail when it answers (HTTP 200 and ``answered`` gives a
    detail), else the status and body, or the transport error."""
    import httpx

    t0 = time.monotonic()
    try:
        r = call()
        detail = answered(r) if r.status_code == 200 else None
        if detail is not None:
            return Probe(name=name, ok=True, seconds=time.monotonic() - t0, detail=detail)
        return Probe(name=name, ok=False, seconds=time.monotonic() - t0, detail=f"HTTP {r.status_code}: {r.text[:200]}")
    except (httpx.HTTPError, ValueError) as exc:
        return Probe(name=name, ok=False, seconds=time.monotonic() - t0,
                     detail=f"{type(exc).__name__}: {str(exc)[:200]}")


def check_llm(settings: LLMSettings | None = None) -> LLMCheck:
    import httpx

    s = settings or LLMSettings()
    out = LLMCheck(configured=s.configured, settings=shown_settings(s))
    if not s.configured:
        return out
    base = (s.base_url or "https://api.openai.com/v1").rstrip("/")
    key = s.api_key.get_secret_value() if s.api_key else "not-needed"

    def models(r: httpx.Response) -> str:
        ids = [m.get("id") for m in (r.json().get("data") or []) if isinstance(m, dict)]
        return f"{len(ids)} model(s); {s.model} {'listed' if s.model in ids else 'not listed'}"

    def chat(r: httpx.Response) -> str | None:
        if not r.json().get("choices"):
            return None  # HTTP 200 without an answer
        return f"answered; {(r.json().get('usage') or {}).get('total_tokens', '?')} token(s)"

    body = {"model": s.model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1, "temperature": 0}
    with httpx.Client(timeout=s.timeout_s, headers={"Authorization": f"Bearer {key}"}) as client:
        out.probes.append(_probe("GET /models", lambda: client.get(f"{base}/models"), models))
        out.probes.append(_probe("chat completion (1 token)",
                                 lambda: client.post(f"{base}/chat/completions", json=body),
                                 chat))
    return out
