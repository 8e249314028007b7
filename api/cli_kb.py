"""`npuport kb build|search|stats`: the knowledge base from the command line."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from api.cli_options import fail
from knowledge.errors import exit_code

kb_app = typer.Typer(no_args_is_help=True, help="The knowledge base: torch_npu / CANN docs, recipes, port memory.")


def _kb_errors() -> tuple[type[BaseException], ...]:
    from knowledge.errors import KBError

    return (KBError,)


@kb_app.command("build")
def kb_build_cmd(
    source: Annotated[list[str] | None, typer.Option("--source", "-s", help="a docs folder, wheel:VERSION, "
                                                                            "matrix:PATH ...")] = None,
    rebuild: Annotated[bool, typer.Option(help="drop the store and build it anew")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Ingest sources into the Chroma store (incremental: unchanged sources cost nothing)."""
    from knowledge.kb.cli_support import kb_build

    try:
        out = kb_build(list(source or []), json=as_json, rebuild=rebuild)
    except _kb_errors() as exc:
        raise fail(str(exc), exit_code(exc)) from exc
    sys.stdout.write((json.dumps(out, indent=1, default=str) if as_json else str(out)) + "\n")


@kb_app.command("search")
def kb_search_cmd(
    query: Annotated[str, typer.Argument(help="an error message, op name or question")],
    k: Annotated[int, typer.Option("--k", help="number of hits")] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Op-aware search: identifiers filter first, dense search fills the rest; hits carry citations."""
    from knowledge.kb.cli_support import kb_search

    try:
        out = kb_search(query, k=k, json=as_json)
    except _kb_errors() as exc:
        raise fail(str(exc), exit_code(exc)) from exc
    sys.stdout.write((json.dumps(out, indent=1, default=str, ensure_ascii=False) if as_json else str(out)) + "\n")


@kb_app.command("stats")
def kb_stats_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """What the store holds."""
    from knowledge.kb.cli_support import kb_stats

    try:
        out = kb_stats(json=as_json)
    except _kb_errors() as exc:
        raise fail(str(exc), exit_code(exc)) from exc
    sys.stdout.write((json.dumps(out, indent=1, default=str) if as_json else str(out)) + "\n")


@kb_app.command("review")
def kb_review_cmd(
    record: Annotated[str, typer.Argument(help="a port-memory record id (memory:...), as report.md lists it")],
    reviewer: Annotated[str, typer.Option(help="who reviewed it (kept in the record)")] = "operator",
) -> None:
    """Mark a learned fix reviewed: an LLM's edit is reused by later ports (every owner's) only after this."""
    from knowledge.locks import home_lock
    from knowledge.port_memory import WRITE_LOCK, read_records, review_record

    rec = next((r for r in read_records() if r.get("id") == record), None)
    if rec is None:
        raise fail(f"no port-memory record {record}", 2)
    sys.stdout.write(json.dumps({k: rec.get(k) for k in ("id", "model", "failure", "patch_summary", "fix")},
                                indent=1, ensure_ascii=False) + "\n")
    with home_lock(WRITE_LOCK):
        review_record(record, reviewer)
    sys.stdout.write(f"{record}: reviewed by {reviewer}; later ports reuse it\n")

