"""Every ``NPUPORT_*`` environment variable, declared once (pydantic-settings).

Why in knowledge/: it is the lowest layer (it imports no other npuport package), so sandbox/,
agents/, graph/ and api/ may all read these without a layering violation. Three sections, one
module, one prefix:

- ``Settings`` (``NPUPORT_``): the home, caches, sandbox, emulator, knowledge base, tuner budgets.
- ``LLMSettings`` (``NPUPORT_LLM_``): the OpenAI-compatible endpoint of the LLM policy.
- ``ServiceSettings`` (``NPUPORT_``): the HTTP service (tokens, model roots, limits, workers).

Modules call ``settings()`` (or ``LLMSettings()`` / ``ServiceSettings()``) when they need a value, not
at import: tests and the service change the environment at run time. ``env_table()`` lists every
variable with its default and meaning for ``npuport --help`` and the README's Configuration table.

This module is also the one writer of the process's environment (``set_environment``): settings are
read from the environment at every call, so a write anywhere else would change them unseen
(tests/test_settings.py holds both: no ``NPUPORT_*`` read and no ``os.environ`` write outside this module,
besides the sandboxed processes it lists, which run without pydantic).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SCOPES = ("read", "write", "admin")
DEFAULT_TORCH_NPU = "2.13.0"
"""The torch_npu release a port emulates or targets unless told otherwise (every default reads this)."""
"""read: look at this token's jobs, events, bundles, chat status questions; write: submit, approve, cancel
this token's jobs; admin: the same on every token's jobs."""


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, extra="ignore", use_attribute_docstrings=True)


class Settings(BaseSettings):
    """Where npuport keeps its files and how it runs ports."""

    model_config = _config("NPUPORT_")

    home: Path | None = None
    """The npuport home: op-support matrices, caches, the Chroma store, checkpoints, workspaces (default ~/.npuport)."""
    wheel_cache: Path | None = None
    """Where downloaded torch_npu wheels are kept (default <home>/wheels), and the transformers wheels whose API
    indexes choose a model's release (with the indexes, transformers-api/)."""
    env_cache: Path | None = None
    """Where the models' layered environments are built (default <home>/envs)."""
    transformers_releases: str = ""
    """The transformers releases a model's environment may choose among, comma-separated (a mirror or an offline
    site with a few wheels); default: the newest release of each minor line the package index offers, from the
    oldest installable here to the host's, and the host's own."""
    native_cache: Path | None = None
    """Where ascend-sim's native C++ engine is built (default ~/.cache/npuport/ascend-sim-native)."""
    isolation: str = "auto"
    """How model code is isolated: bwrap (required), process (unisolated, chosen explicitly), or auto (bwrap
    when usable; otherwise refused unless unisolated runs are allowed)."""
    sandbox: str = ""
    """The older name of NPUPORT_ISOLATION (used when that is unset)."""
    allow_unisolated: bool = False
    """1: where bwrap is unusable, run model code in a plain process sandbox instead of refusing."""
    cgroup_parent: str = ""
    """A cgroup folder (under each controller's mount) delegated to npuport's user, where each run gets its pids
    and memory cgroup."""
    sim_engine: str = "auto"
    """ascend-sim's engine: native (C++, built on first use), python (slower), auto (native when it builds)."""
    kb: str = ""
    """off skips the knowledge base (agents then cite npuport's own recipes only)."""
    chroma_url: str | None = None
    """A Chroma server for the knowledge base instead of the local store in <home>/chroma."""
    embeddings: str = ""
    """The knowledge base's embedder: default (bundled MiniLM), st:/path/to/model or openai:<model>."""
    embeddings_base_url: str | None = None
    """OpenAI-compatible endpoint for openai:<model> embeddings (else OPENAI_BASE_URL)."""
    embeddings_api_key: SecretStr | None = None
    """Key for that endpoint (else OPENAI_API_KEY)."""
    kb_max_file_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    """Larger files are not indexed into the knowledge base."""
    kb_torch_npu: str = DEFAULT_TORCH_NPU
    """The torch_npu release whose wheel `npuport kb build` reads (op list, op-plugin tables, docstrings)."""
    kb_docs: str = ""
    """Extra doc folders for `npuport kb build`, separated by the path separator (os.pathsep)."""
    vllm_ascend_src: Path | None = None
    """A vllm-ascend source tree for the ascend-sim fidelity audit (else its committed name list)."""
    profile: bool = True
    """0: no decode profile in the sandbox runs (the baseline of bench/profile_overhead.py)."""
    moe_dense_max_ratio: float = Field(default=4.0, gt=0)
    """moe-dense-dispatch runs every expert on every token only when experts <= this x top-k (at most this many
    times the routed experts' FLOPs); otherwise the original host-synced loop runs. The patched code reads it
    when it runs (sandbox runs and the bundle)."""
    tune_trials: int | None = Field(default=None, ge=1)
    """Default tuning trials when the request names none (else 12)."""
    tune_time_s: float | None = Field(default=None, gt=0)
    """Default tuning wall time when the request names none (else half the port's wall budget)."""
    serve: bool = True
    """Exercise the deployment of a validated port after its bundle is written (vLLM serves it with serve.sh; tokens
    checked, throughput probed; about 3 minutes after the server's start on a small host) when the request does not
    say (0: write serve.sh only; `npuport deploy BUNDLE` runs it later)."""
    engine_tune_trials: int = Field(default=8, ge=1)
    """Server starts the engine tuner may spend (a tuned port that is served: each trial starts serve.sh with one
    configuration of vLLM's knobs and runs a short load; about a minute each on a small host)."""
    serve_slo_ttft_ms: float | None = Field(default=None, gt=0)
    """The engine tuner's latency objective: a configuration whose median time to first token exceeds it is
    no candidate (unset: no bound)."""
    serve_slo_tpot_ms: float | None = Field(default=None, gt=0)
    """The engine tuner's latency objective: a configuration whose median time per output token exceeds it is
    no candidate (unset: no bound)."""

    @property
    def kb_off(self) -> bool:
        return self.kb.lower() == "off"

    @property
    def isolation_choice(self) -> str:
        """NPUPORT_ISOLATION when it is set, else its older name NPUPORT_SANDBOX, else auto."""
        chosen = self.isolation if "isolation" in self.model_fields_set else (self.sandbox or self.isolation)
        return (chosen or "auto").strip().lower()

    def resolved_home(self) -> Path:
        """The home, created on first use."""
        home = (self.home or Path.home() / ".npuport").expanduser()
        home.mkdir(parents=True, exist_ok=True)
        return home


def settings() -> Settings:
    """The current settings, read from the environment now (cheap; never cached: tests and the
    service set NPUPORT_HOME at run time)."""
    return Settings()


def set_environment(values: dict[str, str], *, keep_set: bool = False) -> None:
    """Set variables in this process's environment, which its children inherit: a flag of the CLI that is a
    setting (NPUPORT_ISOLATION), the service's or a batch worker's home, and the few variables of other
    libraries npuport sets for itself (thread counts, offline Hugging Face). ``keep_set``: a variable
    already set keeps its value. An ``NPUPORT_*`` name must be a declared one."""
    declared = {var for var, _, _ in env_table()}
    unknown = sorted(k for k in values if k.startswith("NPUPORT_") and k not in declared)
    if unknown:
        raise ValueError(f"not npuport settings: {', '.join(unknown)}")
    for name, value in values.items():
        if keep_set:
            os.environ.setdefault(name, value)
        else:
            os.environ[name] = value


class LLMSettings(BaseSettings):
    """The LLM policy's endpoint. Any OpenAI-compatible endpoint works (DeepSeek, vLLM, a model served
    by vllm-ascend). Nothing here reaches the sandbox: it scrubs every variable whose name looks secret."""

    model_config = _config("NPUPORT_LLM_")

    base_url: str | None = None
    """The OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1."""
    model: str | None = None
    """The served model name."""
    api_key: SecretStr | None = None
    """The endpoint's key; local servers usually accept any value."""
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sampling temperature of every LLM call."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Timeout of one LLM call, seconds."""
    max_retries: int = Field(default=1, ge=0, le=10)
    """Retries of one LLM call on transport errors."""
    max_completion_tokens: int = Field(default=4096, ge=16)
    """Completion tokens per LLM call."""
    structured_method: Literal["function_calling", "json_schema"] = "function_calling"
    """How structured answers are requested. Function calling is what most OpenAI-compatible servers
    support (DeepSeek has no json_schema response format); vLLM supports both."""
    token_budget: int = Field(default=200_000, ge=1)
    """Prompt + completion tokens the LLM may spend on one port, counted from the responses' usage."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Most the LLM may cost on one port, in US dollars; with ``usd_per_million_tokens`` it lowers the
    token budget (the lower of the two limits applies). Unset: only the token budget limits."""
    usd_per_million_tokens: float = Field(default=0.0, ge=0)
    """The endpoint's price per million tokens (prompt and completion alike), for ``max_cost_usd``."""
    max_tool_rounds: int = Field(default=8, ge=1, le=50)
    """Model turns per question (each may call tools) before it must answer."""
    max_answer_retries: int = Field(default=2, ge=0, le=10)
    """Times an invalid answer (an edit that does not apply, an unknown codemod) is sent back to the model."""
    max_fix_attempts: int = Field(default=2, ge=1, le=10)
    """LLM fixes per failure signature; the same failure after that many stops the port with a report."""
    tool_output_chars: int = Field(default=6000, ge=200)
    """Cap on what one tool call returns to the model."""
    sandbox_timeout_s: float = Field(default=60.0, gt=0)
    """Wall limit of one run_in_sandbox tool call, seconds."""
    max_sandbox_calls: int = Field(default=3, ge=0)
    """run_in_sandbox calls per question."""
    allow_process_sandbox: bool = False
    """Let the LLM's run_in_sandbox tool run code without bubblewrap (plain process sandbox)."""

    @property
    def port_token_limit(self) -> int:
        """Tokens one port may spend: the token budget, lowered by the cost cap when a price is known."""
        if self.max_cost_usd and self.usd_per_million_tokens > 0:
            return max(1, min(self.token_budget, int(self.max_cost_usd / self.usd_per_million_tokens * 1_000_000)))
        return self.token_budget

    @property
    def configured(self) -> bool:
        """An endpoint is named: a model and a base URL (or a key for the default OpenAI endpoint).
        Without one the hybrid policy never escalates, so nothing ever talks to a default endpoint."""
        return bool(self.model) and bool(self.base_url or self.api_key)


class ServiceSettings(BaseSettings):
    """The HTTP service (`npuport serve`)."""

    model_config = _config("NPUPORT_")

    home: Path | None = None
    """The npuport home (job database, checkpoints, uploads, bundles); default ~/.npuport."""
    tokens: Annotated[dict[str, list[str]], NoDecode] = Field(default_factory=dict)
    """Bearer token -> scopes, as JSON or tokenA=read+write,tokenB=read. With none, protected routes answer 401."""
    allowed_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)
    """Model folders must resolve (symlinks followed) inside one of these (os.pathsep-separated or a JSON list);
    uploads are always allowed."""
    max_upload_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """Cap of one uploaded archive."""
    max_extracted_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    """Cap of an upload once extracted."""
    max_archive_members: int = Field(default=10_000, gt=0)
    """Cap of the files in one uploaded archive."""
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    """Cap of a non-upload request body (JSON)."""
    body_timeout_s: float = Field(default=15.0, gt=0)
    """A client that sends no body bytes for this long gets 408 (slow or stalled clients)."""
    workers: int = Field(default=2, ge=1, le=64)
    """Ports the service runs at once."""
    max_queued: int = Field(default=100, ge=1)
    """Jobs waiting beyond this are refused (429)."""
    max_queued_per_owner: int = Field(default=20, ge=1)
    """Jobs one token may have waiting; beyond, its submissions are refused (429): one owner cannot fill the queue."""
    max_running_per_owner: int = Field(default=0, ge=0, le=64)
    """Jobs of one token running at once (0: half the workers, at least one); its others wait their turn."""
    owner_upload_mb: int = Field(default=1024, ge=1)
    """Disk one token's uploads may hold at once (unpacked); an upload is removed when its job ends."""
    batch_workers: int = Field(default=0, ge=0, le=64)
    """Ports of every batch running at once in the service's worker pool (0: the workers); a request's `workers` may
    only lower it."""
    service_process: bool = False
    """1: this process serves others (npuport serve and langgraph dev set it): every port is confined to the model
    roots."""
    allow_uncapped_memory: bool = False
    """Run ports although a run's memory cannot be capped as a whole here (no writable memory cgroup); the service
    refuses them otherwise."""

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
                # a token named without scopes may read and write its own jobs; admin is never implied
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
        home = (self.home or settings().home or Path.home() / ".npuport").expanduser()
        home.mkdir(parents=True, exist_ok=True)
        return home.resolve()


SECTIONS: tuple[type[BaseSettings], ...] = (Settings, LLMSettings, ServiceSettings)
"""Every settings class; their variables are all of npuport's configuration."""


def env_table() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) for every NPUPORT_* variable, each once, in declaration order."""
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for cls in SECTIONS:
        prefix = str(cls.model_config.get("env_prefix") or "")
        for name, field in cls.model_fields.items():
            var = f"{prefix}{name}".upper()
            if var in seen:
                continue
            seen.add(var)
            default = field.get_default(call_default_factory=True)
            shown = "" if default in (None, "", {}, []) else str(default)
            rows.append((var, shown, " ".join((field.description or "").split())))
    return rows
