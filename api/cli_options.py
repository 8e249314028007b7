"""Options shared by the CLI's commands: the choices a flag accepts are checked against the registries
when the command runs (so a target, chip or policy registered after import is accepted), and the one
way to fail. ``--help`` lists the registries' names as of import (typer renders a fixed metavar)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import typer

from agents.policies import POLICIES
from agents.request import PortRequest
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


# --- the request's options: one per PortRequest field (agents/request.py), its help the field's description ---

FLAGS: dict[str, tuple[str, ...]] = {
    "target": ("--target", "-t"), "max_wall_s": ("--max-wall",), "run_timeout_s": ("--run-timeout",),
    "serve": ("--serve/--no-serve",), "shrink": ("--shrink",), "strict_perf": ("--strict-perf",),
    "bench": ("--bench",)}
"""A field's flag where it is not ``--<field-name>`` / ``--<field>/--no-<field>`` (the spellings users type)."""
CHOICES: dict[str, tuple[Callable[[], tuple[str, ...]], Callable[[str | None], str | None]]] = {
    "target": (target_names, check_target), "chip": (chip_names, check_chip),
    "policy": (policy_names, check_policy)}
"""Fields whose values a registry names: checked when the command runs (a Literal field's come from its type)."""
COMMAND_OWN = ("model_path", "out_dir")
"""The fields a command takes its own way: the PATH argument and --out (a checked folder)."""

Command = TypeVar("Command", bound=Callable[..., Any])


def _option(name: str, annotation: Any, help_text: str) -> tuple[Any, Any]:
    """(the typer type, its Option) of a request field."""
    flags = FLAGS.get(name, ())
    if get_origin(annotation) is Literal:  # a fixed set of words: a str checked against them
        words = tuple(str(a) for a in get_args(annotation))
        return str, typer.Option(*flags, metavar=choices_metavar(lambda: words), help=help_text,
                                 callback=one_of(lambda: words, name))
    if name in CHOICES:
        names, check = CHOICES[name]
        return annotation, typer.Option(*flags, metavar=choices_metavar(names), callback=check, help=help_text)
    return annotation, typer.Option(*flags, help=help_text)


def request_parameters(exclude: tuple[str, ...] = COMMAND_OWN) -> list[inspect.Parameter]:
    """One keyword option per PortRequest field (less ``exclude``), with its default and description."""
    params = []
    for name, info in PortRequest.model_fields.items():
        if name in exclude:
            continue
        typ, option = _option(name, info.annotation, info.description or "")
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[typ, option],
                                        default=info.get_default(call_default_factory=True)))
    return params


def with_request_options(command: Command) -> Command:
    """A command whose ``**request`` takes the request's fields: its signature (what typer reads) gains one
    option per PortRequest field, so a new request field is a new flag with no edit here."""
    sig = inspect.signature(command, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = sig.replace(parameters=[*own, *request_parameters()])  # type: ignore[attr-defined]
    return command


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)
