"""The roles' system prompts: agents/prompts/<role>.md, with the registries' lists rendered where a
prompt names them, so a prompt never restates a list that can change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agents.rules.registry import active as active_rules
from sandbox.targets import CHIP_REGISTRY, TARGETS

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"


def _targets_text() -> str:
    return ", ".join(f'"{n}" ({s.summary})' for n, s in TARGETS.items())


def _chips_text() -> str:
    return ", ".join(f'"{c.key}" ({c.product}{"; also " + ", ".join(c.aliases) if c.aliases else ""})'
                     for c in CHIP_REGISTRY.values())


# Where a prompt lists a registry's entries it says {name}; the list is rendered from the registry in
# force (agents/rules/registry.py, sandbox/targets/registry.py), never written out in the prompt.
PROMPT_LISTS: dict[str, Callable[[], str]] = {
    "{hazard_classes}": lambda: active_rules().catalogue(),
    "{targets}": _targets_text,
    "{chips}": _chips_text,
}


def load_prompt(agent: str) -> str:
    """The system prompt of a role: agents/prompts/<agent>.md, with the registries' lists where it
    names them (``PROMPT_LISTS``)."""
    path = PROMPTS_DIR / f"{agent}.md"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt for agent {agent!r} at {path}")
    text = path.read_text(encoding="utf-8")
    for marker, render in PROMPT_LISTS.items():
        if marker in text:
            text = text.replace(marker, render())
    return text
