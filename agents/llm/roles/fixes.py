"""What a fix proposed by the LLM is, and the check it must pass: an existing codemod that changes
something in the named file, or an edit that applies cleanly inside the workspace and parses
(the patcher's plan and the debugger's diagnosis both propose fixes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agents.fixing.codemods import CODEMODS, LLM_EDIT
from agents.fixing.llm_edits import LLMEdit, SearchReplace, apply_llm_edit, resolve_in
from knowledge.errors import LLMEditError, ToolError, first_line


class FixProposal(BaseModel):
    """The fix: an existing codemod (name it, with its params and file) OR an edit (search/replace
    blocks or a unified diff)."""

    codemod: str | None = Field(default=None, description="name of an existing codemod, or null for an edit")
    codemod_params: dict[str, Any] = Field(default_factory=dict, description="e.g. {'line': 12} for align-devices")
    file: str | None = Field(default=None, description="the file the codemod rewrites")
    edits: list[SearchReplace] = Field(default_factory=list)
    diff: str | None = Field(default=None, description="a unified diff, instead of or besides edits")


def codemod_catalogue() -> dict[str, tuple[str, str]]:
    """name -> (hazard, description) of every codemod the LLM may name (its own edit excluded)."""
    return {name: (hazard, desc) for name, (_fn, hazard, desc) in CODEMODS.items() if name != LLM_EDIT}


def catalogue_text() -> str:
    return "\n".join(f"- {n} ({h}): {d}" for n, (h, d) in codemod_catalogue().items())


def check_fix(codemod: str | None, edits: list[SearchReplace], diff: str | None, model_dir: Path | None,
              file: str | None = None, params: dict[str, Any] | None = None, dry_run: bool = False) -> list[str]:
    """The problems of a proposed fix (none: it may be applied). ``dry_run``: run the codemod on ``file``
    to see that it changes something (a diagnosis names one file; a plan's codemods are checked when applied)."""
    if codemod:
        catalogue = codemod_catalogue()
        if codemod not in catalogue:
            return [f"unknown codemod {codemod!r}; choose from {', '.join(catalogue)} or give an edit"]
        if not dry_run:
            return []
        if not file:
            return [f"name the file that {codemod} rewrites"]
        return dry_run_codemod(codemod, file, params or {}, model_dir)
    edit = LLMEdit(edits=edits, diff=diff)
    if not edit.edits and not edit.diff:
        return ["the fix names neither a codemod nor an edit"]
    if model_dir is None:
        try:  # no workspace to check against: the patcher validates when it applies the edit
            edit.blocks()
        except LLMEditError as exc:
            return [str(exc)]
        return []
    return apply_llm_edit(model_dir, edit, write=False).errors


def dry_run_codemod(codemod: str, file: str, params: dict[str, Any], model_dir: Path | None) -> list[str]:
    if model_dir is None:
        return []
    try:
        path = resolve_in(model_dir, file)
        result = CODEMODS[codemod][0](path.read_text(encoding="utf-8"), **params)
    except (ToolError, OSError, TypeError, ValueError) as exc:
        return [f"{codemod} on {file}: {exc}"]
    except Exception as exc:  # noqa: BLE001 - a codemod's own failure (e.g. a parse error) goes back to the model
        return [f"{codemod} cannot rewrite {file}: {type(exc).__name__}: {first_line(exc, 200)}"]
    return [] if result.changed else [f"{codemod} changes nothing in {file}; propose an edit instead"]
