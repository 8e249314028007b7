"""npuport's error types, in one place, and ``first_line`` for one-line messages.

Why here: knowledge/ is the lowest layer (it imports no other npuport package), so every layer
(sandbox, agents, graph, api) may import these without a layering violation; every importer
imports them from here (no module re-exports them). Every class keeps its historical built-in base (``RuntimeError``,
``ValueError``) so callers catching those still catch them; ``NpuportError`` is the root of every error a user can
meet (tests/test_error_family.py fails on one outside it).

Each class says what kind of failure it is (``kind``): ``user`` (bad input or usage: nothing was run),
``port`` (the port or the command ran and failed for a reason the message gives) or ``internal``
(a broken host or dependency); any other exception is a bug, ``internal`` too. The CLI's exit code
(``exit_code``), the node guard's failure record (``error_record``), the batch and the service read
the kind, never the message.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

ErrorKind = Literal["user", "port", "internal"]
EXIT_CODES: dict[str, int] = {"port": 1, "user": 2, "internal": 3}
"""The exit code of each kind (api/cli.py's table): 1 the port or check failed, 2 bad input, 3 internal."""


def first_line(exc: BaseException | str, limit: int | None = None) -> str:
    """The first non-empty line of an exception's message (or of a string), never raising:
    ``str(exc).splitlines()[0]`` raised IndexError on an empty message. An exception with an empty
    message reads as its type name."""
    text = str(exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line and isinstance(exc, BaseException):
        line = type(exc).__name__
    return line[:limit] if limit is not None else line


class NpuportError(Exception):
    """Base of npuport's own errors: an expected failure whose message is one line for the user.

    ``fields`` holds structured details (the unknown name, the choices, the file ...) that callers and
    reports read instead of parsing the message."""

    kind: ClassVar[ErrorKind] = "port"

    def __init__(self, *args: object, **fields: Any) -> None:
        super().__init__(*args)
        self.fields: dict[str, Any] = fields

    def __reduce__(self) -> tuple[Any, ...]:
        # survives pickling (Ray, process pools) whatever the subclass's own __init__ takes
        return (_restore, (type(self), self.args), self.__dict__)


def _restore(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    return cls.__new__(cls, *args)


def error_kind(exc: BaseException | None) -> ErrorKind:
    """``exc``'s kind: its class's for npuport's errors, ``internal`` (a bug) for anything else."""
    return exc.kind if isinstance(exc, NpuportError) else "internal"


def exit_code(exc: BaseException | str | None) -> int:
    """The CLI's exit code for an exception, or for a kind already recorded (a failure record's)."""
    kind = exc if isinstance(exc, str) else error_kind(exc)
    return EXIT_CODES.get(kind, EXIT_CODES["internal"])


def error_record(exc: BaseException, limit: int = 500) -> dict[str, Any]:
    """What a failure record (the guard's, the batch's, a job's) keeps of an exception: its type, its
    kind, whether npuport expected it, the first line of its message and its structured fields."""
    return {"error": type(exc).__name__, "kind": error_kind(exc), "expected": isinstance(exc, NpuportError),
            "message": first_line(exc, limit),
            "fields": {k: v for k, v in getattr(exc, "fields", {}).items() if _plain(v)}}


def _plain(value: Any) -> bool:
    # only JSON-able details go into records kept in checkpoints
    if isinstance(value, str | int | float | bool) or value is None:
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


class UserError(NpuportError):
    """Bad input or usage (exit 2): nothing was run."""

    kind: ClassVar[ErrorKind] = "user"


class HostError(NpuportError):
    """This host or an optional dependency cannot do what was asked (exit 3, like a bug)."""

    kind: ClassVar[ErrorKind] = "internal"


# -- workspace and model discovery (agents) ------------------------------------------------------


class WorkspaceError(HostError, RuntimeError):
    """The workspace (a git copy of the user's model) could not be created or changed."""


class UntrustedValue(UserError, ValueError):
    """A value of an untrusted file (model folder, upload, manifest, bundle) that is not of the allowed kind;
    the message says which field. Bad input: nothing of it was used."""


class GoalError(UserError, ValueError):
    """The goal text or request could not be understood."""


class EntryNotFound(NpuportError):
    """No way to run the model was found; the message is one line saying why."""


class ManifestError(EntryNotFound):
    """npuport.yaml exists but is wrong; the message names the field."""

    kind: ClassVar[ErrorKind] = "user"


class EnvBuildError(NpuportError, RuntimeError):
    """The layered environment could not be built (the message says what and why)."""


# -- LLM policy and its tools (agents.policies) --------------------------------------------------


class LLMEditError(NpuportError, ValueError):
    """An edit the LLM proposed cannot be applied (no match, does not parse, ...)."""


class BudgetExhausted(NpuportError, RuntimeError):
    """The LLM's token budget for this port is spent."""


class AnswerRejected(NpuportError, RuntimeError):
    """The LLM's answer does not follow the expected schema, even after retries."""


class ToolError(NpuportError, ValueError):
    """A tool call of the LLM had bad arguments or could not run."""


class NoFeasiblePoint(NpuportError, RuntimeError):
    """The tuner's constraints leave no configuration to try."""


# -- targets and sandbox ---------------------------------------------------------------------------


class TargetError(UserError, ValueError):
    """An unknown or unusable target or chip."""


class Infeasible(NpuportError, RuntimeError):
    """This configuration cannot run here (not a bug in the model)."""


# -- knowledge: op-support matrices and torch_npu wheels -----------------------------------------


class MatrixError(NpuportError, RuntimeError):
    """A matrix could not be built or loaded."""


class YamlError(NpuportError, ValueError):
    """The yaml is not an op-plugin functions file, or a version field is malformed."""


class WheelError(NpuportError, RuntimeError):
    """The wheel is missing, unreadable or not a torch_npu wheel."""


class WheelDownloadError(WheelError):
    """``pip download`` failed; ``unreachable`` says the registry could not be reached."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message, unreachable=unreachable)
        self.unreachable = unreachable


# -- the sandbox, the batch and the service ----------------------------------------------------------


class IsolationUnavailable(HostError, RuntimeError):
    """bwrap is missing or unusable and nobody allowed unisolated runs."""


class NativeUnavailable(HostError, RuntimeError):
    """The emulator's C++ engine cannot be built or loaded here (the Python engine is used instead)."""


class SpecError(NpuportError, ValueError):
    """A harness spec that is not a spec of its kind (unknown or missing fields): npuport's own bug, since
    only npuport writes specs (sandbox/harness/spec.py)."""

    kind: ClassVar[ErrorKind] = "internal"


class StubCalled(NpuportError, RuntimeError):
    """The model called a CUDA-only library's stub that has no CPU reference implementation."""


class KBError(NpuportError, RuntimeError):
    """A knowledge-base problem with a message that says what to do."""


class KBStoreError(KBError):
    """The Chroma store cannot be read or does not match this configuration."""


class KBDependencyError(KBError):
    """An optional package (chromadb, sentence-transformers, the packaged model ...) is missing."""

    kind: ClassVar[ErrorKind] = "user"  # installing the extra is the user's fix, as for a Ray-less batch


class SourceSyntaxError(UserError, ValueError):
    """scan_source on text that does not parse (scan_tree reports these as ParseError)."""

    def __init__(self, file: str, line: int, col: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}", file=file, line=line, col=col)
        self.file, self.line, self.col, self.message = file, line, col, message


class UnknownFindingRule(NpuportError, ValueError):
    """A detector emitted a finding rule id its HazardRule does not declare (neither fixed nor manual)."""


class BatchManifestError(UserError, ValueError):
    """A batch manifest we cannot use; the message says where and why (one line per problem)."""


class SourceError(UserError, ValueError):
    """A batch model source (a folder or an archive) we refuse."""


class BatchBusy(UserError, RuntimeError):
    """The batch is already being driven by another `npuport batch` (nothing was started)."""


class ExecutorError(UserError, RuntimeError):
    """The batch's executor cannot start: its package is not installed, or --ray-address does not answer."""


class UploadError(UserError, ValueError):
    """An archive or a model path the service refuses; ``status_code`` is the HTTP answer (400, 403, 413)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message, status_code=status_code)
        self.status_code = status_code


class SubmitError(UserError, ValueError):
    """A port request the service refuses; ``status_code`` is the HTTP answer."""

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message, status_code=status_code)
        self.status_code = status_code


class JobError(UserError):
    """A request the job's state does not allow (HTTP 409), or a full queue (429)."""

    def __init__(self, message: str, status_code: int = 409) -> None:
        super().__init__(message, status_code=status_code)
        self.status_code = status_code
