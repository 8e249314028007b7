"""Options shared by the CLI's commands: the choices a flag accepts are checked against the registries
when the command runs (so a target, chip or policy registered after import is accepted), and the one
way to fail. ``--help`` lists the registries' names as of import (typer renders a fixed metavar)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from agents.policies import POLICIES
from api.cli_live import err
from sandbox.targets import chip_names, target_names

EXIT_OK, EXIT_NOT_VALIDATED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def policy_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def one_of(names: Callable[[], tuple[str, ...]], what: str) -> Callable[[str | None], str | None]:
    """A typer callback: the value must be one of ``names()`` at the time the command runs."""
    def check(value: str | None) -> str | None:
        if value is None:
            return value
        choices = names()
        if value not in choices:
            raise typer.BadParameter(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
        return value

    return check


def choices_metavar(names: Callable[[], tuple[str, ...]]) -> str:
    return "[" + "|".join(names()) + "]"


check_target = one_of(target_names, "target")
check_chip = one_of(chip_names, "chip")
check_policy = one_of(policy_names, "policy")

TargetOpt = Annotated[str, typer.Option("--target", "-t", metavar=choices_metavar(target_names), callback=check_target,
                                         help="where the port runs: a real NPU, the emulator, or the CPU")]
ChipOpt = Annotated[str, typer.Option("--chip", metavar=choices_metavar(chip_names), callback=check_chip,
                                      help="the Ascend chip")]
PolicyOpt = Annotated[str, typer.Option("--policy", metavar=choices_metavar(policy_names), callback=check_policy,
                                        help="rule (offline, default) | llm | hybrid (rules first, "
                                        "then the LLM; set NPUPORT_LLM_*)")]


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)
