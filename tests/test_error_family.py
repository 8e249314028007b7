"""One error family: every exception class npuport defines derives from ``NpuportError``
(knowledge/errors.py), so the node guard, the CLI's exit code, the batch and the service tell a
user's mistake from a port failure and from a bug by the class. Control-flow signals that never
reach a user are listed here by name, with the reason."""

from __future__ import annotations

import ast
import importlib
import pickle
from pathlib import Path

import pytest

from knowledge import errors
from knowledge.errors import NpuportError, error_kind, error_record, exit_code

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "api", "bench", "graph", "knowledge", "sandbox")
# Signals caught by the code that raises them; none is ever shown to a user.
SIGNALS = {
    "sandbox.generate_capture._GenerateCalled": "stops a preprocessing call at generate() to capture its inputs",
    "agents.rules.h6_codemods._Unsupported": "a codemod declines a site; the rewrite skips it",
    "graph.jobs_support.StopRequested": "a cancel request unwinds the graph thread",
    "api.limits.BodyLimitExceeded": "an HTTPException (413): FastAPI's own family",
}
BUILTIN_BASES = {"Exception", "BaseException", "RuntimeError", "ValueError", "KeyError", "LookupError",
                 "TypeError", "OSError", "IOError", "HTTPException"}


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class) for every class whose bases name an exception type, found in the source."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "static" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                names = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases}
                if names & BUILTIN_BASES or any(n.endswith(("Error", "Exception")) for n in names):
                    found.append((module, node.name))
    return found


def test_every_error_type_derives_from_npuport_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 20, classes  # the scan itself works
    outside = []
    for module, name in classes:
        if f"{module}.{name}" in SIGNALS:
            continue
        cls = getattr(importlib.import_module(module), name)
        if not issubclass(cls, NpuportError):
            outside.append(f"{module}.{name}")
    assert outside == [], f"error types outside NpuportError (derive them, or list a signal with its reason): {outside}"


def test_modules_that_defined_an_error_still_name_it() -> None:
    """The old homes keep the names (others import them from there): the class is the one in knowledge/errors."""
    for module, name in [("api.jobs", "JobError"), ("api.uploads", "UploadError"), ("api.submit", "SubmitError"),
                         ("graph.batch.manifest", "BatchManifestError"), ("graph.batch.runner", "BatchBusy"),
                         ("graph.batch.executors", "ExecutorError"), ("graph.batch.sources", "SourceError"),
                         ("sandbox.process", "IsolationUnavailable"), ("sandbox.redirect", "StubCalled"),
                         ("sandbox.ascend_sim.native_build", "NativeUnavailable"), ("knowledge.kb", "KBError"),
                         ("agents.scanner", "SourceSyntaxError"), ("agents.rules.base", "UnknownFindingRule")]:
        assert getattr(importlib.import_module(module), name) is getattr(errors, name)


@pytest.mark.parametrize(("exc", "kind", "code"), [
    (errors.GoalError("no folder in the goal"), "user", 2),
    (errors.TargetError("unknown target 'gpu'"), "user", 2),
    (errors.ManifestError("npuport.yaml: entry.class is missing"), "user", 2),
    (errors.BatchManifestError("models[0]: does not exist"), "user", 2),
    (errors.ExecutorError("batch mode on Ray needs the `ray` package"), "user", 2),
    (errors.EntryNotFound("no forward"), "port", 1),
    (errors.EnvBuildError("no torch for Python 3.14"), "port", 1),
    (errors.MatrixError("no wheel"), "port", 1),
    (errors.WorkspaceError("git is missing"), "internal", 3),
    (errors.IsolationUnavailable("bwrap cannot create namespaces"), "internal", 3),
    (KeyError("model_path"), "internal", 3),  # a bug
])
def test_the_exit_code_comes_from_the_class(exc: BaseException, kind: str, code: int) -> None:
    assert error_kind(exc) == kind and exit_code(exc) == code and exit_code(kind) == code
    assert error_record(exc)["kind"] == kind


def test_errors_keep_their_fields_and_builtin_bases_through_pickling() -> None:
    """Ray and process pools pickle exceptions: the subclass's own __init__ (or keyword-only fields)
    must not break the round trip."""
    for exc in (errors.SourceSyntaxError("m.py", 3, 4, "invalid syntax"), errors.JobError("no job x", 404),
                errors.WheelDownloadError("pip download failed", unreachable=True),
                errors.TargetError("unknown chip 'h100'", value="h100", choices=["910b"])):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.fields == exc.fields
        assert back.__dict__ == exc.__dict__
    assert isinstance(errors.JobError("x"), Exception) and isinstance(errors.UploadError("x"), ValueError)
    assert isinstance(errors.KBError("x"), RuntimeError)  # callers catching the built-in bases still do
