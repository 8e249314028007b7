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
    "sandbox.inputs.generate_capture._GenerateCalled": "stops a preprocessing call at generate() to capture its inputs",
    "agents.rules.h6.mask_parts._Unsupported": "a codemod declines a site; the rewrite skips it",
    "api.limits.BodyLimitExceeded": "an HTTPException (413): FastAPI's own family",
    # stdlib only: it lives in the model's worker before site runs, where npuport's packages are not imported
    "sandbox.isolation.worker_channel.ChannelClosed": "the worker's channel to its supervisor ended; the supervisor "
                                                      "reports the run",
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


def test_error_types_are_imported_from_their_one_home() -> None:
    """No module passes an error type on: every ``from X import SomeError`` names knowledge.errors."""
    names = {n for n, c in vars(errors).items() if isinstance(c, type) and issubclass(c, BaseException)}
    wrong = []
    for path in [p for pkg in (*PACKAGES, "tests") for p in sorted((ROOT / pkg).rglob("*.py"))]:
        if "fixtures" in path.parts or "hazard_corpus" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module != "knowledge.errors" and \
                    node.module.split(".")[0] in ("agents", "graph", "knowledge", "sandbox", "api", "tests"):
                wrong += [f"{path.relative_to(ROOT)}: from {node.module} import {a.name}"
                          for a in node.names if a.name in names]
    assert wrong == [], wrong


def test_architecture_counts_the_error_types() -> None:
    family = [c for c in vars(errors).values()
              if isinstance(c, type) and issubclass(c, NpuportError) and c.__module__ == errors.__name__]
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert f", {len(family)} in all)" in text, f"docs/architecture.md should say {len(family)} error types"


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
