"""The LLM policy's tools: read_file, grep, search_kb, run_in_sandbox.

The model only asks; our code executes, inside the port's workspace, and every answer is bounded
(characters, lines, hits, calls) so a tool result cannot flood the context or the token budget.
Tools never raise to the model: a bad call comes back as a one-line "error: ..." it can act on.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from agents.fixing.llm_edits import resolve_in
from knowledge.errors import ToolError, first_line
from knowledge.settings import LLMSettings

MAX_READ_LINES = 400
MAX_GREP_HITS = 60
MAX_FILE_BYTES = 2 * 1024 * 1024  # larger files are not source worth reading or grepping


class ReadFileArgs(BaseModel):
    """Read a file of the model (path relative to the model root), with line numbers."""

    path: str = Field(description="file path relative to the model root, e.g. 'modeling_x.py'")
    start_line: int = Field(default=1, ge=1, description="first line to show (1-based)")
    end_line: int | None = Field(default=None, ge=1, description="last line to show; default: start + 400")


class GrepArgs(BaseModel):
    """Search the model's files for a regular expression; returns 'file:line: text' hits."""

    pattern: str = Field(description="Python regular expression")
    glob: str = Field(default="**/*.py", description="which files, relative to the model root")
    ignore_case: bool = False


class SearchKbArgs(BaseModel):
    """Search the knowledge base (Ascend docs, op support, npuport's hazard recipes) for facts to cite."""

    query: str = Field(description="what to look up, e.g. an error message, op name or API")
    k: int = Field(default=4, ge=1, le=8)


class RunInSandboxArgs(BaseModel):
    """Run a short Python snippet in the sandbox (model root on sys.path, no network, no secrets) to
    check a hypothesis; returns exit status, stdout and stderr (tails)."""

    code: str = Field(description="Python source to run with `python -c`")


TOOL_SCHEMAS: dict[str, type[BaseModel]] = {
    "read_file": ReadFileArgs,
    "grep": GrepArgs,
    "search_kb": SearchKbArgs,
    "run_in_sandbox": RunInSandboxArgs,
}


def bounded(text: str, limit: int) -> str:
    """Head and tail of ``text`` within ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f"\n... [{len(text) - limit} characters cut] ...\n"
    keep = max(0, limit - len(note))
    head = keep * 2 // 3
    return text[:head] + note + text[len(text) - (keep - head):]


def default_kb_search(query: str, k: int) -> list[dict[str, str]]:
    """Knowledge-base hits, then npuport's own recipes whose signals match (these need no index)."""
    hits: list[dict[str, str]] = []
    try:
        from knowledge.kb.kb import KnowledgeBase

        for h in KnowledgeBase().search(query, k=k):
            hits.append({"cite": h.cite, "title": h.title, "text": h.text})
    except Exception as exc:  # noqa: BLE001 - a missing or broken index must not stop the policy
        hits.append({"cite": "", "title": "knowledge base unavailable", "text": first_line(exc, 200)})
    from knowledge.kb.recipes import load_recipes

    for r in load_recipes():
        if len(hits) < k + 2 and r.matches(query):
            hits.append({"cite": r.id, "title": r.title, "text": r.text()})
    return hits


@dataclass
class ToolBox:
    """The tools of one question, bound to one workspace."""

    model_dir: Path | None
    scratch_dir: Path | None = None
    max_chars: int = 6000
    sandbox_timeout_s: float = 60.0
    max_sandbox_calls: int = 3
    kb_search: Callable[[str, int], list[dict[str, str]]] = default_kb_search
    python: str = sys.executable
    log: list[dict[str, Any]] = field(default_factory=list)
    """Every call: name, args, and the size of what it returned (for the trace)."""

    def schemas(self) -> list[type[BaseModel]]:
        return list(TOOL_SCHEMAS.values())

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI function specs, named as the model must call them."""
        from langchain_core.utils.function_calling import convert_to_openai_tool

        out = []
        for name, schema in TOOL_SCHEMAS.items():
            spec = convert_to_openai_tool(schema)
            spec["function"]["name"] = name
            out.append(spec)
        return out

    def run(self, name: str, args: dict[str, Any]) -> str:
        """Execute one tool call; the answer is always a bounded string."""
        schema = TOOL_SCHEMAS.get(name)
        if schema is None:
            out = f"error: no tool {name!r}; tools: {', '.join(TOOL_SCHEMAS)}"
        else:
            try:
                parsed = schema.model_validate(args or {})
                out = getattr(self, f"_{name}")(parsed)
            except ValidationError as exc:
                out = f"error: bad arguments for {name}: {exc.errors()[0]['msg']}"
            except (ToolError, OSError, re.error, ValueError, NotImplementedError) as exc:
                out = f"error: {exc}"
        out = bounded(out, self.max_chars)
        self.log.append({"tool": name, "args": args, "chars": len(out)})
        return out

    def _root(self) -> Path:
        if self.model_dir is None:
            raise ToolError("no workspace is attached to this question, so files cannot be read")
        return self.model_dir

    def _read_file(self, a: ReadFileArgs) -> str:
        path = resolve_in(self._root(), a.path)
        if not path.is_file():
            raise ToolError(f"{a.path}: no such file in the model")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ToolError(f"{a.path}: too large to read ({path.stat().st_size} bytes)")
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        end = min(len(lines), a.end_line or a.start_line + MAX_READ_LINES - 1, a.start_line + MAX_READ_LINES - 1)
        if a.start_line > len(lines):
            return f"{a.path} has {len(lines)} lines"
        body = "\n".join(f"{n:5d}| {lines[n - 1]}" for n in range(a.start_line, end + 1))
        more = f"\n[{a.path}: lines {a.start_line}-{end} of {len(lines)}]"
        return body + more

    def _grep(self, a: GrepArgs) -> str:
        root = self._root().resolve()
        if a.glob.startswith(("/", "~")) or ".." in Path(a.glob).parts:
            raise ToolError(f"glob {a.glob!r} must stay inside the model folder")
        rx = re.compile(a.pattern, re.I if a.ignore_case else 0)
        hits: list[str] = []
        for path in sorted(root.glob(a.glob)):
            # Symlinks may point outside the workspace: only files that resolve inside it are read.
            if not path.resolve().is_relative_to(root):
                continue
            rel = path.relative_to(root)
            if not path.is_file() or ".git" in rel.parts or path.stat().st_size > MAX_FILE_BYTES:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if rx.search(line):
                    hits.append(f"{rel.as_posix()}:{n}: {line.strip()[:200]}")
                    if len(hits) >= MAX_GREP_HITS:
                        return "\n".join(hits) + f"\n[stopped at {MAX_GREP_HITS} hits; narrow the pattern]"
        return "\n".join(hits) if hits else "no matches"

    def _search_kb(self, a: SearchKbArgs) -> str:
        hits = self.kb_search(a.query, a.k)
        if not hits:
            return "no hits"
        per = max(200, self.max_chars // max(1, len(hits)) - 100)
        return "\n\n".join(f"[{h.get('cite', '')}] "
                           f"{h.get('title', '')}\n{bounded(' '.join(h.get('text', '').split()), per)}"
                           for h in hits)

    def _run_in_sandbox(self, a: RunInSandboxArgs) -> str:
        from knowledge.errors import IsolationUnavailable
        from sandbox.isolation.process import Limits, default_sandbox, scrubbed_env

        used = sum(1 for e in self.log if e["tool"] == "run_in_sandbox")
        if used >= self.max_sandbox_calls:
            raise ToolError(f"the sandbox may run {self.max_sandbox_calls} snippets per question; answer now")
        root = self._root().resolve()
        try:
            box = default_sandbox()
        except IsolationUnavailable as exc:
            raise ToolError(f"run_in_sandbox needs bubblewrap isolation (bwrap), which this host lacks: {exc}") from exc
        if box.name == "process" and not LLMSettings().allow_process_sandbox:
            # Without bwrap the snippet could read the host's files and its output goes to the LLM provider.
            raise ToolError("run_in_sandbox needs bubblewrap isolation (bwrap), which this host lacks; "
                            "answer from read_file and grep (NPUPORT_LLM_ALLOW_PROCESS_SANDBOX=1 allows it)")
        scratch = self.scratch_dir or root.parent / "llm_scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        env = scrubbed_env({"PYTHONPATH": str(root)})
        res = box.execute([self.python, "-c", a.code], cwd=scratch, env=env,
                                        limits=Limits(wall_s=self.sandbox_timeout_s))
        restored = _restore_workspace(root)
        half = self.max_chars // 2 - 100
        parts = [f"status: {res.status} (exit code {res.returncode}, {res.wall_s:.1f} s)",
                 "stdout:\n" + bounded(res.stdout, half), "stderr:\n" + bounded(res.stderr, half)]
        if restored:
            parts.append("note: the snippet changed files in the workspace; those changes were undone")
        return "\n".join(parts)


def _restore_workspace(model_dir: Path) -> bool:
    """Undo whatever a snippet wrote into the git workspace (edits go through the patcher only)."""
    from agents.workspace import Workspace

    return Workspace(model_dir.parent).restore()
