"""Settings of the LLM policy (pydantic-settings, env prefix ``NPUPORT_LLM_``).

Any OpenAI-compatible endpoint works (DeepSeek, vLLM, a model served by vllm-ascend)::

    NPUPORT_LLM_BASE_URL=http://127.0.0.1:8000/v1
    NPUPORT_LLM_MODEL=deepseek-chat
    NPUPORT_LLM_API_KEY=...            # optional for local servers
    NPUPORT_LLM_TOKEN_BUDGET=200000    # prompt + completion tokens per port

Nothing here reaches the sandbox: the sandbox scrubs every variable whose name looks secret.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class LLMSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NPUPORT_LLM_", extra="ignore")

    base_url: str | None = None
    """The OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str | None = None
    """The served model name."""
    api_key: SecretStr | None = None
    """The endpoint's key; local servers usually accept any value."""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=1, ge=0, le=10)
    max_completion_tokens: int = Field(default=4096, ge=16)
    structured_method: Literal["function_calling", "json_schema"] = "function_calling"
    """How structured answers are requested. Function calling is what most OpenAI-compatible servers
    support (DeepSeek has no json_schema response format); vLLM supports both."""
    token_budget: int = Field(default=200_000, ge=1)
    """Prompt + completion tokens the LLM may spend on one port, counted from the responses' usage."""
    max_tool_rounds: int = Field(default=8, ge=1, le=50)
    """Model turns per question (each may call tools) before it must answer."""
    max_answer_retries: int = Field(default=2, ge=0, le=10)
    """Times an invalid answer (an edit that does not apply, an unknown codemod) is sent back to the model."""
    max_fix_attempts: int = Field(default=2, ge=1, le=10)
    """LLM fixes per failure signature; the same failure after that many stops the port with a report."""
    tool_output_chars: int = Field(default=6000, ge=200)
    """Cap on what one tool call returns to the model."""
    sandbox_timeout_s: float = Field(default=60.0, gt=0)
    max_sandbox_calls: int = Field(default=3, ge=0)
    """run_in_sandbox calls per question."""

    @property
    def configured(self) -> bool:
        """An endpoint is named: a model and a base URL (or a key for the default OpenAI endpoint).
        Without one the hybrid policy never escalates, so nothing ever talks to a default endpoint."""
        return bool(self.model) and bool(self.base_url or self.api_key)
