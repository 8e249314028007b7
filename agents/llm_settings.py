"""Settings of the LLM policy (env prefix ``NPUPORT_LLM_``): declared with every other NPUPORT_*
variable in knowledge/settings.py; re-exported here for the policy's callers.

Any OpenAI-compatible endpoint works (DeepSeek, vLLM, a model served by vllm-ascend)::

    NPUPORT_LLM_BASE_URL=http://127.0.0.1:8000/v1
    NPUPORT_LLM_MODEL=deepseek-chat
    NPUPORT_LLM_API_KEY=...            # optional for local servers
    NPUPORT_LLM_TOKEN_BUDGET=200000    # prompt + completion tokens per port
"""

from __future__ import annotations

from knowledge.settings import LLMSettings

__all__ = ["LLMSettings"]
