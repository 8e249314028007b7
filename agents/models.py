"""Typed records shared by agents, graph state, reports and the API.

Every record has a stable ``id`` so reports and later steps can cite it. Large artefacts
(tracebacks, logs, diffs) stay in the workspace; records carry paths and digests.
Kept free of torch / chromadb imports so that ``graph`` and ``api`` import fast.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field


class HazardCategory(StrEnum):
    BLOCKS_RUNNING = "blocks running"
    CHANGES_NUMBERS = "changes numbers"
    SLOWS_DOWN = "slows down"


class Severity(StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Citation(BaseModel):
    """A fact from the knowledge base (or a recipe) that backs a finding, diagnosis or patch."""

    source: str  # e.g. "recipe:H1", "torch_npu_docs/torch_npu-npu_rms_norm.md#..."
    title: str = ""
    excerpt: str = ""


class Finding(BaseModel):
    """One hazard found by the static scan (DESIGN §7)."""

    id: str  # stable: "<hazard>-<file>-<line>-<rule>"
    hazard: str  # "H1".."H11"
    rule: str  # short machine name, e.g. "cuda-call", "flash-attn-import"
    file: str  # relative to the model root, posix separators
    line: int
    col: int = 0
    snippet: str = ""
    message: str
    category: HazardCategory
    severity: Severity
    citations: list[Citation] = Field(default_factory=list)
    fixable: bool = True  # a codemod exists for it


class Patch(BaseModel):
    """One commit in the workspace."""

    id: str
    commit: str  # git sha in the workspace
    summary: str  # commit subject
    finding_ids: list[str] = Field(default_factory=list)
    diagnosis_id: str | None = None
    files: list[str] = Field(default_factory=list)
    codemod: str = ""  # name of the codemod / recipe that produced it
    citations: list[Citation] = Field(default_factory=list)
    edits: list[str] = Field(default_factory=list)  # "file line N: what" for each rewrite (the report lists them)
    sites: list[str] = Field(default_factory=list)  # "file:start-end": the original lines the rewrites covered
    declined: list[str] = Field(default_factory=list)  # "file line N: why" for sites the codemod left as written


class Frame(BaseModel):
    file: str
    line: int
    func: str = ""
    code: str = ""
    in_model: bool = False  # the frame is in the model's own (workspace) files


class StructuredException(BaseModel):
    type: str
    message: str
    frames: list[Frame] = Field(default_factory=list)
    traceback_path: str | None = None
    # What the failing process could tell beyond the message (sandbox/harness/failure_hints.py): where a
    # missing name is provided, close spellings of an attribute or keyword, the inputs a call still needs.
    # The model process's claim: the debugger's classes validate every name before a codemod uses it.
    hints: dict[str, Any] = Field(default_factory=dict)


class RunRecord(BaseModel):
    """One sandbox run, as the harness reported it."""

    id: str
    purpose: Literal["reference", "port", "benchmark", "inventory", "verify"]
    target: str
    ok: bool
    status: Literal["ok", "error", "timeout", "killed", "crashed"]
    wall_s: float
    result_path: str  # harness result JSON in the workspace run dir
    outputs_digest: str = ""
    tokens: list[list[int]] | None = None
    timings: dict[str, Any] = Field(default_factory=dict)
    exception: StructuredException | None = None
    warnings: list[str] = Field(default_factory=list)
    op_stats: dict[str, Any] = Field(default_factory=dict)
    isolation: str = ""  # "bwrap" or "process" (no filesystem/network isolation): said in the report
    shrunk: list[str] | None = None  # under --shrink: each config change ("path: old -> new")
    inputs: dict[str, Any] | None = None  # where the inputs came from: {source: hook|preprocess|synthesised, notes}
    # A forward run (an encoder: no generate): its named floating outputs, name -> {shape, dtype}; the tensors
    # are in the run folder's outputs.pt, which the validator compares with the original's.
    output_tensors: dict[str, Any] | None = None
    # A reference run of an original that cannot be built without CUDA: the switch-only edits made to the
    # reference copy ("reference adjusted: file line N: what (why)"), agents/validation/reference.py.
    reference_adjusted: list[str] | None = None
    # Sub-models the model's code fetches from the Hub by id at construction, built offline (no network in a
    # run): one note each (sandbox/harness/hub_offline.py).
    built_offline: list[str] | None = None
    # Which layer kinds, towers and parts of the model ran in this run (sandbox/harness/coverage.py): {kinds:
    # [{kind, role, ran, modules}], ran: [...], not_run: [...]}; agents/validation/coverage.py reads it.
    coverage: dict[str, Any] | None = None


class Diagnosis(BaseModel):
    """The debugger's reading of a failed run."""

    id: str
    run_id: str
    signature: str  # stable failure signature, e.g. "missing-module:flash_attn"
    kind: str  # "missing-cuda-module", "cuda-assert", "device-mismatch", "npu-dtype", ...
    summary: str
    file: str | None = None
    line: int | None = None
    fix: str | None = None  # name of the fix recipe / codemod to apply, None when none applies
    params: dict[str, Any] = Field(default_factory=dict)
    citations: list[Citation] = Field(default_factory=list)


class Numerics(BaseModel):
    """Validator verdict."""

    verdict: Literal["match", "mismatch", "not-run", "nondeterministic-reference", "model-fails"]
    # What was compared: the greedy tokens of generate, or (a model without generate) the forward's outputs
    # within the port dtype's tolerance (metrics["outputs"] per tensor).
    compared: Literal["tokens", "outputs"] = "tokens"
    token_agreement: float = 0.0
    reference_tokens: list[list[int]] | None = None
    port_tokens: list[list[int]] | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    first_diverging_module: str | None = None
    detail: str = ""
    # The module kinds the compared runs covered (agents/validation/coverage.py): a kind that did not run in the
    # port or the reference makes the verdict "validated (partial: ...)".
    coverage: dict[str, Any] = Field(default_factory=dict)


class TrialRecord(BaseModel):
    id: str
    params: dict[str, Any]
    value: float | None
    status: str
    detail: str = ""


class Tuning(BaseModel):
    status: Literal["skipped", "done", "failed"] = "skipped"
    best: dict[str, Any] = Field(default_factory=dict)
    trials: list[TrialRecord] = Field(default_factory=list)
    baseline: dict[str, Any] = Field(default_factory=dict)
    tuned: dict[str, Any] = Field(default_factory=dict)
    detail: str = ""
    # "knob=value" -> why it cannot run (e.g. "not supported by the model code: <error> (at file:line)")
    unsupported: dict[str, str] = Field(default_factory=dict)
    # What the real-NPU serving loop measured (agents/deploy/vllm_loop.py): its best settings and where it
    # measured them ("best", "measured_on"); the deploy bundle's serve settings start from it.
    serving: dict[str, Any] = Field(default_factory=dict)


class FixAction(BaseModel):
    """One patch to make: a codemod over some files (one commit)."""

    codemod: str
    files: list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    finding_ids: list[str] = Field(default_factory=list)
    diagnosis_id: str | None = None
    summary: str
    citations: list[Citation] = Field(default_factory=list)


# --- the port's own records in the graph state (agents/state.py reads each one) ------------------


class Plan(BaseModel):
    """The planner's plan: its steps, the policy in charge and where the reading came from."""

    steps: list[str] = Field(default_factory=list)
    policy: str = ""
    source: str = ""  # "rules" | "llm": who read the goal
    target: str = ""  # the requested target (the resolved one is the state's target)
    chip: str = ""
    objective: str = ""
    constraints: list[str] = Field(default_factory=list)
    budget: dict[str, Any] = Field(default_factory=dict)  # max_runs, max_wall_s, tune_trials
    # The planner's LLM exchanges, held until the code reader has a workspace to save them in (then dropped).
    llm_records: list[dict[str, Any]] = Field(default_factory=list)


class Counters(BaseModel):
    """Sandbox runs made so far: the port's (the max_runs budget) and the reference's."""

    port_runs: int = 0
    reference_runs: int = 0


class EnvironmentRecord(BaseModel):
    """The environment node's notes, the model's resolved pins and the layered venv's python."""

    notes: list[str] = Field(default_factory=list)
    resolution: dict[str, Any] | None = None  # agents/environment/resolution.py Resolution.as_dict()
    python: str | None = None  # the layered venv's interpreter; None: the host's


class BundleRecord(BaseModel):
    """The reporter's output: the bundle folder, the files written (name -> path) and a note."""

    dir: str = ""
    files: dict[str, str] = Field(default_factory=dict)
    note: str = ""


class DeploymentBrief(BaseModel):
    """What the state keeps of the deployment phase (agents/report/deployment.py deployment_brief); the
    record itself is the bundle's deployment.json."""

    status: str | None = None
    summary: str = ""
    file: str = ""


class FailureRecord(BaseModel):
    """A node that raised (graph/guard.py; a batch task's or a job's crash alike)."""

    node: str = ""
    error: str = ""  # the exception's type name
    kind: str = "internal"  # user | port | internal (knowledge/errors.py error_kind): the CLI's exit code
    expected: bool = False  # an npuport error rather than a bug
    message: str = ""  # the first line of its message
    fields: dict[str, Any] = Field(default_factory=dict)
    traceback: str | None = None  # a file in the workspace, never the text
    t: float | None = None
