"""LLM edits, validated: search/replace blocks (or a unified diff) proposed by the LLM policy, applied
only when every block matches exactly once inside the workspace and every edited file still parses.

A skill outside agents/policies so that the codemod registry can register ``llm-edit`` without
importing the policy (which itself reads the registry).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from knowledge.errors import LLMEditError, ToolError, first_line

if TYPE_CHECKING:
    from agents.rules.kit import CodemodResult


def resolve_in(root: Path, rel: str) -> Path:
    """``rel`` as a path inside ``root``; anything that leaves it (absolute, .., symlinks) is refused."""
    if not rel or rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        raise ToolError(f"{rel!r}: give a path relative to the model root")
    root = root.resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root) or ".git" in path.relative_to(root).parts:
        raise ToolError(f"{rel!r} is outside the model")
    return path


class SearchReplace(BaseModel):
    """Replace one exact, unique block of a model file."""

    file: str = Field(description="file path relative to the model root")
    search: str = Field(description="the exact current text (whole lines, as read_file shows them, "
                                    "without the line-number prefix); it must occur exactly once")
    replace: str = Field(description="the new text for that block")


class LLMEdit(BaseModel):
    """An edit as search/replace blocks and/or a unified diff (``--- a/f`` / ``+++ b/f`` / ``@@`` hunks)."""

    edits: list[SearchReplace] = Field(default_factory=list)
    diff: str | None = None

    def blocks(self) -> list[SearchReplace]:
        return [*self.edits, *(diff_to_edits(self.diff) if self.diff else [])]


@dataclass
class EditResult:
    """What ``apply_llm_edit`` did, shaped like ``agents.fixing.codemods.CodemodResult`` (per file)."""

    changed: bool
    files: list[str] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)  # "file line N: replaced K line(s) with M"
    errors: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # file -> new source

    @property
    def ok(self) -> bool:
        return not self.errors


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")
_LINE_NO = re.compile(r"^\s*\d+\| ?")


def diff_to_edits(diff: str) -> list[SearchReplace]:
    """A unified diff as search/replace blocks: each hunk's old side (context and removed lines) is
    replaced by its new side (context and added lines). Line numbers are not trusted, context is."""
    out: list[SearchReplace] = []
    file: str | None = None
    old: list[str] = []
    new: list[str] = []
    in_hunk = False

    def flush() -> None:
        if in_hunk and file and (old or new):
            out.append(SearchReplace(file=file, search="".join(old), replace="".join(new)))

    for line in diff.splitlines():
        if line.startswith("+++ "):
            flush()
            in_hunk, old, new = False, [], []
            path = line[4:].split("\t")[0].strip()
            file = path[2:] if path.startswith(("a/", "b/")) else path
        elif line.startswith("--- ") and not in_hunk:
            continue
        elif _HUNK.match(line):
            flush()
            in_hunk, old, new = True, [], []
        elif in_hunk and line.startswith("\\"):
            continue  # "\ No newline at end of file"
        elif in_hunk:
            tag, text = (line[0], line[1:]) if line else (" ", "")
            if tag in (" ", "-"):
                old.append(text + "\n")
            if tag in (" ", "+"):
                new.append(text + "\n")
            if tag not in (" ", "-", "+"):
                raise LLMEditError(f"not a unified diff line: {line[:80]!r}")
        elif line.strip() and not line.startswith(("diff ", "index ", "new file", "deleted file")):
            raise LLMEditError(f"not a unified diff line: {line[:80]!r}")
    flush()
    if not out:
        raise LLMEditError("the diff holds no hunks")
    return out


def _strip_line_numbers(text: str) -> str:
    """Models often copy read_file's '   12| ' prefixes into the search text; drop them when every line has one."""
    lines = text.splitlines(keepends=True)
    if lines and all(_LINE_NO.match(ln) for ln in lines if ln.strip()):
        return "".join(_LINE_NO.sub("", ln, count=1) for ln in lines)
    return text


def apply_blocks(source: str, blocks: Sequence[SearchReplace], file: str) -> tuple[str, list[str]]:
    """Apply search/replace blocks to one file's source, in order; raise LLMEditError when one does not
    match exactly once. Returns the new source and one note per block."""
    notes: list[str] = []
    for i, b in enumerate(blocks, 1):
        search = b.search
        if source.count(search) != 1 and search.strip():
            search = _strip_line_numbers(search)
        if not search.strip():
            raise LLMEditError(f"{file}: block {i} has an empty search text")
        hits = source.count(search)
        if hits == 0:
            raise LLMEditError(f"{file}: block {i}'s search text is not in the file (copy it exactly, "
                               f"whitespace included): {first_line(search, 100)!r}")
        if hits > 1:
            raise LLMEditError(f"{file}: block {i}'s search text occurs {hits} times; add lines around it "
                               "so it is unique")
        line = source[: source.index(search)].count("\n") + 1
        source = source.replace(search, b.replace, 1)
        notes.append(f"line {line}: replaced {len(search.splitlines())} line(s) with "
                     f"{len(b.replace.splitlines())} (LLM edit)")
    return source, notes


def _check_parses(file: str, source: str) -> None:
    if not file.endswith(".py"):
        return
    import libcst as cst

    try:
        cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise LLMEditError(f"{file}: the edited file does not parse: {first_line(exc)}") from None


def apply_llm_edit(workspace_model_dir: Path, edit: LLMEdit | dict[str, Any], *, write: bool = True) -> EditResult:
    """Validate an LLM edit against the workspace and (with ``write``) apply it: every file must be a
    file inside the workspace, every block must match exactly once, and every edited Python file
    must parse with libcst. All or nothing: nothing is written unless every file passes."""
    edit = edit if isinstance(edit, LLMEdit) else LLMEdit.model_validate(edit)
    try:
        blocks = edit.blocks()
    except LLMEditError as exc:
        return EditResult(False, errors=[str(exc)])
    if not blocks:
        return EditResult(False, errors=["the edit holds no search/replace blocks and no diff"])
    by_file: dict[str, list[SearchReplace]] = {}
    for b in blocks:
        by_file.setdefault(b.file.replace("\\", "/"), []).append(b)
    result = EditResult(False)
    for rel, file_blocks in by_file.items():
        try:
            path = resolve_in(workspace_model_dir, rel)
            if not path.is_file():
                raise LLMEditError(f"{rel}: no such file in the workspace (edits may not create files)")
            old = path.read_text(encoding="utf-8")
            new, notes = apply_blocks(old, file_blocks, rel)
            _check_parses(rel, new)
        except (LLMEditError, ToolError, UnicodeDecodeError) as exc:
            result.errors.append(str(exc))
            continue
        if new != old:
            result.sources[rel] = new
            result.files.append(rel)
            result.edits.extend(f"{rel} {n}" for n in notes)
    if result.errors:
        return EditResult(False, errors=result.errors)
    if not result.sources:
        return EditResult(False, errors=["the edit changes nothing"])
    if write:
        for rel, new in result.sources.items():
            resolve_in(workspace_model_dir, rel).write_text(new, encoding="utf-8")
    result.changed = True
    return result


def llm_edit_codemod(source: str, *, edits: list[dict[str, Any]], file: str | None = None, **_: Any) -> CodemodResult:
    """The ``llm-edit`` codemod: apply the search/replace blocks meant for ``file`` to its source.

    When the caller does not say which file this is (``file=None``), the blocks whose search text is
    in this source are applied. An edit that does not apply cleanly or does not parse leaves the
    source unchanged (the patcher then commits nothing and reports that nothing changed).
    """
    from agents.rules.kit import CodemodResult

    blocks = [SearchReplace.model_validate(e) for e in edits]
    if file is not None:
        mine = [b for b in blocks if b.file.replace("\\", "/") == file]
    else:
        mine = [b for b in blocks if b.search in source or _strip_line_numbers(b.search) in source]
    if not mine:
        return CodemodResult(source, False)
    name = file or mine[0].file
    try:
        new, notes = apply_blocks(source, mine, name)
        _check_parses(name, new)
    except LLMEditError as exc:
        return CodemodResult(source, False, [f"rejected: {exc}"])
    return CodemodResult(new, new != source, notes)
