"""Whose a layered environment is. An env holds what its install set named; when the model chose any of
it (its requirements, its imports, its guarded imports), the env is its owner's: the env key carries the
owner (knowledge.port_memory's current owner: a job's token, a batch's owner, ``local`` for the CLI), so
another owner's port with the same install set builds its own instead of running wheels, and whatever
their .pth files left in the env folder, that someone else's model chose. An env whose installs are all
npuport's own pins (a transformers era from npuport's table, a torch pair's overlay) is shared: its
content is decided by npuport and the index alone. The env's marker records the owner and where each
requirement came from (``provenance``)."""

from __future__ import annotations

from typing import Any

from knowledge.port_memory import current_owner


def npuport_pins(resolution: Any) -> set[str]:
    """Requirements of the install set that npuport chose, not the model."""
    own = {resolution.era} if resolution.era else set()
    # the era's base env (its transformers, and what npuport adds to every base of the era)
    own |= set(getattr(resolution, "era_installs", None) or [])
    return own | set((resolution.torch_pair or {}).get("overlay") or [])


def provenance(resolution: Any) -> dict[str, str]:
    """requirement -> who chose it ("npuport" or "model")."""
    own = npuport_pins(resolution)
    return {r: ("npuport" if r in own else "model") for r in [*resolution.install, *resolution.optional]}


def env_owner(resolution: Any) -> str:
    """The owner an env is built for, or "" when its install set is npuport's own (shared)."""
    return "" if all(v == "npuport" for v in provenance(resolution).values()) else current_owner()
