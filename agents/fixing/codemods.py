"""Codemods: the patcher's deterministic source rewrites (libcst). Each hazard rule holds its own
(agents/rules/h*.py, shared tools in agents/rules/kit.py); this module is the table the patcher and the
policies look codemods up in: the active rule registry's fixes, plus the LLM policy's validated edit.

Each codemod takes source text and returns new source text (unchanged when nothing applies), so it is
a pure function that tests can drive on snippets. The patcher commits each applied codemod.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from agents.rules.kit import CodemodResult

LLM_EDIT = "llm-edit"
Entry = tuple[Callable[..., CodemodResult], str, str]  # (function, hazard, one-line description)


class _Codemods(Mapping[str, Entry]):
    """name -> (function, hazard, description), read from the active rule registry at each lookup, so a
    rule registered for a test (agents.rules.registry.use_registry) brings its codemods along."""

    def _table(self) -> dict[str, Entry]:
        from agents.fixing.llm_edits import llm_edit_codemod
        from agents.rules.registry import active

        table = active().codemods()
        table[LLM_EDIT] = (llm_edit_codemod, "LLM", "an edit proposed by the LLM policy, validated (in the "
                                                    "workspace, applies cleanly, parses)")
        return table

    def __getitem__(self, name: str) -> Entry:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


CODEMODS: Mapping[str, Entry] = _Codemods()

__all__ = ["CODEMODS", "LLM_EDIT", "Entry"]
