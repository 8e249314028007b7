"""The serving stack of a bundle: vllm-ascend, vLLM, torch, torch_npu, CANN and transformers chosen as ONE tuple
from what a vllm-ascend release pins (agents/data/compat.yaml's ``vllm_ascend`` rows, written from vllm-ascend's
release compatibility matrix), never assembled package by package.

Known-bad releases steer the choice: a release listed as ``Known bad: vllm-ascend <version> ...`` in the
knowledge base (our note knowledge/facts/serving_stacks.md is indexed by every ``npuport kb build``; a user's
own notes in the same form count too) is skipped, with its reason. When the knowledge base is not built, the
packaged note is read directly and the stack says so. The newest final release (release candidates only when
no final one is left) that is not known bad is chosen.

The port's op inventory ran on the port's torch_npu (the target's); the stack says whether that is the
tuple's, and how to inventory against the tuple's when it is not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

FACTS = Path(__file__).resolve().parents[2] / "knowledge" / "facts" / "serving_stacks.md"
_BAD = re.compile(r"^Known bad: vllm-ascend v?(\S+)\s+(.*)$", re.M)
QUERY = "vllm-ascend known bad release start-up failure serving stack"

Search = Callable[[str, int], list[Any]]


def default_search() -> Search | None:
    """The knowledge base's search over the collection our notes go to, or None when no KB is usable."""
    from agents.reading.citations import kb_status

    if kb_status().startswith(("off", "not built")):
        return None
    try:
        from knowledge.kb import KnowledgeBase

        kb = KnowledgeBase()
        if not kb.counts().get("ascend_ops"):
            return None
    except Exception:  # a broken store must not stop the bundle; the stack says the KB was not used
        return None
    return lambda query, k: kb.search(query, k=k, collections=["ascend_ops"])


def known_bad(search: Search | None) -> tuple[dict[str, str], str]:
    """({vllm-ascend version: reason}, where it came from)."""
    found: dict[str, str] = {}
    if search is not None:
        for hit in search(QUERY, 8):
            path = Path(str(getattr(hit, "path", "") or ""))
            text = path.read_text(errors="replace") if path.is_file() else str(getattr(hit, "text", ""))
            for version, why in _BAD.findall(text):
                found.setdefault(version, f"{why.strip()} ({getattr(hit, 'source', path.name)})")
        if found:
            return found, "the knowledge base"
    text = FACTS.read_text() if FACTS.is_file() else ""
    for version, why in _BAD.findall(text):
        found.setdefault(version, f"{why.strip()} (knowledge/facts/serving_stacks.md)")
    how = ("npuport's packaged note knowledge/facts/serving_stacks.md, read directly: the knowledge base is not "
           "built (`npuport kb build` indexes it, with any notes of yours in the same form)") if search is None else \
        "npuport's packaged note (the knowledge base returned no known-bad release)"
    return found, how


def _version(v: str) -> Version:
    try:
        return Version(v)
    except InvalidVersion:
        return Version("0")


def choose_stack(compat: dict[str, Any], search: Search | None, port_torch_npu: str | None = None) -> dict[str, Any]:
    """The serving tuple (module docstring)."""
    rows: dict[str, dict[str, Any]] = compat.get("vllm_ascend", {})
    bad, source = known_bad(search)
    ordered = sorted(rows, key=lambda v: (not _version(v).is_prerelease, _version(v)), reverse=True)
    skipped = [{"vllm_ascend": v, "reason": bad[v]} for v in ordered if v in bad]
    chosen = next((v for v in ordered if v not in bad), None)
    if chosen is None:
        return {"chosen": None, "skipped": skipped, "known_bad_from": source,
                "note": "every vllm-ascend release in agents/data/compat.yaml is known bad"}
    row = rows[chosen]
    vllm_tf = (compat.get("vllm", {}).get(str(row["vllm"])) or {}).get("transformers")
    stack = {"vllm_ascend": chosen, "vllm": row["vllm"], "torch": row["torch"], "torch_npu": row["torch_npu"],
             "cann": row["cann"], "python": row["python"], "transformers": row.get("transformers"),
             "transformers_range": vllm_tf}
    same_npu = bool(port_torch_npu) and str(port_torch_npu) == str(row["torch_npu"])
    inventory = (f"the port's op inventory used torch_npu {port_torch_npu}, the stack's" if same_npu else
                 f"the port's op inventory used torch_npu {port_torch_npu or '(none)'}; the stack runs torch_npu "
                 f"{row['torch_npu']}: `npuport ops PATH --torch-npu {row['torch_npu']}` inventories against it")
    return {"chosen": stack, "skipped": skipped, "known_bad_from": source, "op_inventory": inventory,
            "op_inventory_matches": same_npu,
            "note": (f"vllm-ascend {chosen} as its release pins it: vLLM {row['vllm']}, torch {row['torch']}, "
                     f"torch_npu {row['torch_npu']}, CANN {row['cann']}, transformers "
                     f"{row.get('transformers') or vllm_tf or '(not pinned by the release)'}")
            + ("; known bad, never chosen: " + "; ".join(f"{s['vllm_ascend']}: {s['reason']}" for s in skipped)
               if skipped else "")}


def stack_lines(stack: dict[str, Any] | None) -> list[str]:
    """The report's lines on the serving stack."""
    if not stack:
        return []
    lines = ["### Serving stack (one tuple from a vllm-ascend release)", ""]
    chosen = stack.get("chosen")
    if chosen:
        lines.append(f"- {stack['note']}")
        lines.append(f"- known-bad releases from {stack['known_bad_from']}")
        lines.append(f"- {stack['op_inventory']}")
    else:
        lines.append(f"- none chosen: {stack.get('note')}")
    return lines + [""]
