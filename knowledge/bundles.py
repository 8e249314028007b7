"""Which folders npuport wrote: a bundle carries a marker file, so ``--force`` (and a later port)
can tell npuport's own output from a user's folder and never delete or overwrite the latter."""

from __future__ import annotations

import json
import time
from pathlib import Path

MARKER = ".npuport-bundle"
"""Written first into every bundle folder (JSON: what wrote it and when)."""


def mark_bundle(out_dir: Path, owner: str = "") -> None:
    """Claim ``out_dir`` as an npuport bundle (before any other file is written into it). ``owner``
    names the port that writes it (its workspace), so a resumed port may rewrite its own bundle
    while another port's bundle is never overwritten (bundle_owner)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text(json.dumps({"written_by": "npuport", "owner": owner,
                                              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")


def bundle_owner(folder: Path) -> str | None:
    """The port that wrote the bundle in ``folder``: its owner, "" for a bundle of unknown owner (a legacy
    one, or a marker written without one), None when ``folder`` is no npuport bundle."""
    if not is_npuport_bundle(folder):
        return None
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(data.get("owner") or "") if isinstance(data, dict) else ""


def _legacy_bundle(folder: Path) -> bool:
    """A bundle written before the marker existed: report.json with the reporter's keys and trace.jsonl."""
    report = folder / "report.json"
    if not report.is_file() or not (folder / "trace.jsonl").is_file() or report.stat().st_size > 64 << 20:
        return False
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"status", "reason", "request", "counters"} <= data.keys()


def is_npuport_bundle(folder: Path) -> bool:
    """True when ``folder`` is a real folder (not a link) that npuport wrote."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    marker = folder / MARKER
    return (marker.is_file() and not marker.is_symlink()) or _legacy_bundle(folder)


def bundle_dir_problem(folder: Path) -> str | None:
    """Why npuport may not write a bundle into ``folder`` (even with --force), or None.

    Empty or missing: free. npuport's own bundle: replaceable with --force (the caller checks that).
    Anything else holds a user's files and is never written."""
    if folder.is_symlink():
        return f"{folder} is a symbolic link; give the folder itself"
    if not folder.exists():
        return None
    if not folder.is_dir():
        return f"{folder} exists and is not a folder"
    if not any(folder.iterdir()) or is_npuport_bundle(folder):
        return None
    return (f"{folder} holds files npuport did not write (no {MARKER} or npuport report.json); "
            "it is never emptied, even with --force: choose another --out")
