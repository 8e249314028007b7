"""npuport's error types, in one place, and ``first_line`` for one-line messages.

Why here: knowledge/ is the lowest layer (it imports no other npuport package), so every layer
(sandbox, agents, graph, api) may import these without a layering violation. Each module that
used to define one of these re-exports it, so ``from agents.workspace import WorkspaceError``
still works. Every class keeps its historical built-in base (``RuntimeError``, ``ValueError``)
so callers catching those still catch them; ``NpuportError`` is the common base for new code.
"""

from __future__ import annotations


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
    """Base of npuport's own errors: an expected failure whose message is one line for the user."""


# -- workspace and model discovery (agents) ------------------------------------------------------


class WorkspaceError(NpuportError, RuntimeError):
    """The workspace (a git copy of the user's model) could not be created or changed."""


class GoalError(NpuportError, ValueError):
    """The goal text or request could not be understood."""


class EntryNotFound(NpuportError):
    """No way to run the model was found; the message is one line saying why."""


class ManifestError(EntryNotFound):
    """npuport.yaml exists but is wrong; the message names the field."""


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


class TargetError(NpuportError, ValueError):
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
        super().__init__(message)
        self.unreachable = unreachable


class NodeFailed(NpuportError, RuntimeError):
    """A graph node raised: carries the failure record the guard wrote into the state."""
