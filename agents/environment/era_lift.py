"""Lifting an era to the nearest release that has the code's names.

config.json's ``transformers_version`` can be older than the code beside it (a checkpoint saved with 4.23
by code that imports ``transformers.generation``, 4.26+). The release to run is then the nearest newer line
that has every name the code imports, not the last 4.x: later lines removed private helpers the same code
calls (``_extract_past_from_model_output`` is gone by 4.49). Each candidate line's sources are read from its
wheel (downloaded by the confined pip, never imported or run), cached per line, and searched the way
``missing_transformers_names`` searches an installed release."""

from __future__ import annotations

import ast
import logging
import re
import shutil
import sys
import zipfile
from pathlib import Path

from agents.environment.pins import model_py_files
from agents.environment.resolve import _spelled_in, transformers_names
from agents.environment.torch_pair import minor_of


def line_of(requirement: str) -> tuple[int, int] | None:
    """(major, minor) of ``transformers~=4.23.0`` / ``transformers<4.50`` (for ``<``, the line below)."""
    spec = requirement.removeprefix("transformers").strip()
    try:
        if spec.startswith("~="):
            return minor_of(spec[2:])
        if spec.startswith("<"):
            major, minor = minor_of(spec[1:])
            return (major, minor - 1) if minor else None
    except (ValueError, IndexError):
        return None
    return None


def _line_sources(line: tuple[int, int], cache: Path, timeout_s: float) -> Path | None:
    """The transformers package folder of the newest patch of ``line``, unpacked from its wheel (sources
    only) under ``cache``; None when the index has no wheel of it."""
    done_dir = cache / f"{line[0]}.{line[1]}"
    package = done_dir / "transformers"
    if (done_dir / ".complete").is_file():
        return package
    from sandbox.isolation.installs import run_pip

    shutil.rmtree(done_dir, ignore_errors=True)
    wheels = done_dir / "wheel"
    wheels.mkdir(parents=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
            "--disable-pip-version-check", "-d", str(wheels), f"transformers~={line[0]}.{line[1]}.0"]
    try:
        run_pip(argv, writable=(done_dir,), timeout=timeout_s)
    except Exception:  # noqa: BLE001  (an index that cannot answer leaves the lift at the last 4.x)
        return None
    found = sorted(wheels.glob("transformers-*.whl"))
    if not found:
        return None
    with zipfile.ZipFile(found[-1]) as wheel:
        for member in wheel.namelist():
            parts = Path(member).parts
            # the package's Python sources only, and no member that would land outside the folder
            if parts and parts[0] == "transformers" and member.endswith(".py") and ".." not in parts:
                target = done_dir.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(member))
    shutil.rmtree(wheels, ignore_errors=True)
    (done_dir / ".complete").write_text(found[-1].name)
    return package


# torch's Module and the standard library's Logger give these; transformers is not asked for them. Only the
# Logger's own: an imported transformers adds `warning_once` to logging.Logger, which is the question here.
_GIVEN = frozenset(n for n in dir(logging.Logger)
                   if getattr(getattr(logging.Logger, n), "__module__", "logging") in ("logging", "builtins", None)) \
    | frozenset({"forward", "cuda", "npu"})
_DEF = re.compile(r"^\s*def (\w+)\s*\(", re.M)


def inherited_calls(model_dir: Path) -> list[tuple[str, str]]:
    """(method, "file:line") the model calls on ``self`` or on a logger (``self._extract_past_from_model_output(``,
    ``logger.warning_once(``) that its own code does not define and torch's Module / logging's Logger do not
    give: methods it inherits from transformers, which a release must have."""
    try:
        import torch.nn

        given = _GIVEN | frozenset(dir(torch.nn.Module))
    except ImportError:
        given = _GIVEN
    trees = []
    for path in model_py_files(model_dir):
        try:
            trees.append((path, ast.parse(path.read_text(encoding="utf-8", errors="replace"))))
        except SyntaxError:
            continue
    own: set[str] = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)  # self.tokenizer = ...: the model's own attribute
    derived = _transformers_classes([t for _, t in trees])
    out: dict[str, str] = {}
    for path, tree in trees:
        scopes: list[tuple[ast.AST, tuple[str, ...]]] = [(tree, ("logger",))]
        scopes += [(c, ("self", "logger")) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name in derived]
        for scope, receivers in scopes:
            for node in ast.walk(scope):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in receivers \
                        and f.attr not in own and f.attr not in given and not f.attr.startswith("__"):
                    out.setdefault(f.attr, f"{path.relative_to(model_dir).as_posix()}:{node.lineno}")
    return sorted(out.items())


def _transformers_classes(trees: list[ast.Module]) -> set[str]:
    """The model's classes that derive (directly or through its own classes) from a transformers base
    (``PreTrainedModel``, ``PreTrainedTokenizer``, ``GenerationMixin``...): their ``self`` has its methods."""
    bases: dict[str, list[str]] = {}
    for tree in trees:
        for c in ast.walk(tree):
            if isinstance(c, ast.ClassDef):
                bases[c.name] = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in c.bases]
    derived = {n for n, bs in bases.items() if any(b.lower().startswith("pretrained") or b == "GenerationMixin"
                                                   for b in bs)}
    grew = True
    while grew:
        more = {n for n, bs in bases.items() if n not in derived and any(b in derived for b in bs)}
        derived |= more
        grew = bool(more)
    return derived


def _defined(package: Path) -> set[str]:
    """Every function and method name the release's sources define."""
    names: set[str] = set()
    for source in package.rglob("*.py"):
        names.update(_DEF.findall(source.read_text(encoding="utf-8", errors="replace")))
    return names


def nearest_line(model_dir: Path, era: str, last: str, cache: Path,
                 timeout_s: float = 120.0) -> tuple[str | None, list[str]]:
    """(``transformers~=4.N.0``, the lines passed over): the oldest line newer than ``era`` and not past
    ``last`` whose sources spell every name the model imports from transformers; None when none does
    below ``last`` (the caller keeps ``last``)."""
    start, stop = line_of(era), line_of(last)
    wanted = transformers_names(model_dir)
    if start is None or stop is None or not wanted or start[0] != stop[0]:
        return None, []
    calls = inherited_calls(model_dir)
    passed: list[str] = []
    for minor in range(start[1] + 1, stop[1] + 1):
        package = _line_sources((start[0], minor), cache, timeout_s)
        if package is None:
            continue
        lacking = [f"{mod}.{name}" for mod, name, _ in wanted if not _spelled_in(package, mod, name)]
        if not lacking and calls:
            defined = _defined(package)
            lacking = [f"{name} ({where})" for name, where in calls if name not in defined]
        if not lacking:
            return f"transformers~={start[0]}.{minor}.0", passed
        passed.append(f"{start[0]}.{minor} lacks {', '.join(lacking[:2])}")
    return None, passed
