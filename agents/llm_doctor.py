"""`npuport doctor`: what LLM endpoint is configured (key masked) and whether it answers.

Two probes, each with the configured timeout: ``GET <base>/models`` (the served models) and a one-token
chat completion with the configured model. The endpoint is healthy only when the chat call answers.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from knowledge.settings import LLMSettings


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


def check_llm(settings: LLMSettings | None = None) -> LLMCheck:
    import httpx

    s = settings or LLMSettings()
    out = LLMCheck(configured=s.configured, settings=shown_settings(s))
    if not s.configured:
        return out
    base = (s.base_url or "https://api.openai.com/v1").rstrip("/")
    key = s.api_key.get_secret_value() if s.api_key else "not-needed"
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=s.timeout_s, headers=headers) as client:
        t0 = time.monotonic()
        try:
            r = client.get(f"{base}/models")
            if r.status_code == 200:
                ids = [m.get("id") for m in (r.json().get("data") or []) if isinstance(m, dict)]
                listed = "listed" if s.model in ids else "not listed"
                out.probes.append(Probe(name="GET /models", ok=True, seconds=time.monotonic() - t0,
                                        detail=f"{len(ids)} model(s); {s.model} {listed}"))
            else:
                out.probes.append(Probe(name="GET /models", ok=False, seconds=time.monotonic() - t0,
                                        detail=f"HTTP {r.status_code}: {r.text[:200]}"))
        except (httpx.HTTPError, ValueError) as exc:
            out.probes.append(Probe(name="GET /models", ok=False, seconds=time.monotonic() - t0,
                                    detail=f"{type(exc).__name__}: {str(exc)[:200]}"))
        t0 = time.monotonic()
        body = {"model": s.model, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1,
                "temperature": 0}
        try:
            r = client.post(f"{base}/chat/completions", json=body)
            if r.status_code == 200 and r.json().get("choices"):
                usage = r.json().get("usage") or {}
                out.probes.append(Probe(name="chat completion (1 token)", ok=True, seconds=time.monotonic() - t0,
                                        detail=f"answered; {usage.get('total_tokens', '?')} token(s)"))
            else:
                out.probes.append(Probe(name="chat completion (1 token)", ok=False, seconds=time.monotonic() - t0,
                                        detail=f"HTTP {r.status_code}: {r.text[:200]}"))
        except (httpx.HTTPError, ValueError) as exc:
            out.probes.append(Probe(name="chat completion (1 token)", ok=False, seconds=time.monotonic() - t0,
                                    detail=f"{type(exc).__name__}: {str(exc)[:200]}"))
    return out
