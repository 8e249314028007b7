"""H3 across files: a model module that the model itself imports under ``try/except ImportError``.

``bert_layers.py`` does ``try: from .flash_attn_triton import flash_attn_qkvpacked_func`` / ``except
ImportError: flash_attn_qkvpacked_func = None``, and ``flash_attn_triton.py`` imports triton unguarded: where
triton is missing, that module's import fails and the model's own fallback (None, so the torch path) runs.
Guarding triton inside flash_attn_triton.py (H3's guard-cuda-only-imports) makes the module import, so the
model takes the Triton path and fails in it ("assert q.is_cuda"), a failure the original never had. So the
CUDA-only imports of such a module are left as written: its import failing IS the model's switch to its
torch path. A tree-level refinement of H3's findings (the scanner calls it with every Python source)."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import PurePosixPath

from agents.models import Finding

GUARDED_RULES = frozenset({"cuda-only-import", "unused-cuda-only-import"})
_CATCHES = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else "") in _CATCHES
               for t in types)


def _target(importer: str, node: ast.ImportFrom | ast.Import, sources: Mapping[str, str]) -> list[str]:
    """The model files an import statement names (relative imports resolved from the importer's folder)."""
    names: list[str] = []
    if isinstance(node, ast.ImportFrom):
        base = PurePosixPath(importer).parent
        for _ in range(max(node.level - 1, 0)):
            base = base.parent
        module = (node.module or "").replace(".", "/")
        names.append((base / module).as_posix() if node.level else module)
        names += [(base / module / a.name).as_posix() if node.level else f"{module}/{a.name}" for a in node.names]
    else:
        names += [a.name.replace(".", "/") for a in node.names]
    out = []
    for n in names:
        n = n.removeprefix("./")
        for cand in (f"{n}.py", f"{n}/__init__.py"):
            if cand in sources:
                out.append(cand)
    return out


def optional_modules(sources: Mapping[str, str]) -> dict[str, str]:
    """model file -> "importer.py:line" for every model file some model file imports inside a ``try`` whose
    handler catches ImportError."""
    out: dict[str, str] = {}
    for rel, text in sources.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try) or not any(_catches_import_error(h) for h in node.handlers):
                continue
            for stmt in node.body:
                for imp in ast.walk(stmt):
                    if isinstance(imp, ast.Import | ast.ImportFrom):
                        for target in _target(rel, imp, sources):
                            if target != rel:
                                out.setdefault(target, f"{rel}:{imp.lineno}")
    return out


def refine(findings: list[Finding], sources: Mapping[str, str]) -> list[Finding]:
    """H3's guard findings in a module the model imports under ``try/except ImportError``: not fixable,
    saying why."""
    optional = optional_modules(sources)
    out = []
    for f in findings:
        where = optional.get(f.file)
        if f.hazard == "H3" and f.rule in GUARDED_RULES and where and f.fixable:
            f = f.model_copy(update={"fixable": False, "message": (
                f"{f.message}. Left as written: the model imports this module under try/except ImportError "
                f"({where}), so this import failing is the model's own switch to its torch path; guarding it "
                "would make the module import and the model take the CUDA-only path")})
        out.append(f)
    return out
