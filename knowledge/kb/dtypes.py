"""Which dtypes an aclnn operator supports on a chip, answered from the CANN reference in the store.

Its own module because it reads the store (kb.py), which ingests through sources.py -> aclnn.py."""

from __future__ import annotations

from typing import Any

from knowledge.kb.aclnn import AclnnDoc, DtypeSupport, chip_of
from knowledge.kb.kb import KnowledgeBase


def supported_dtypes(name: str, chip: str | None = None, kb: Any = None) -> DtypeSupport | None:
    """Which dtypes the aclnn op ``name`` (`aclnnAdd`, `aten::add_`, `add`) supports on ``chip``,
    from the CANN reference docs in the knowledge base (None when no doc names it).

    ``kb``: a KnowledgeBase (default: the one under NPUPORT_HOME).
    """
    if kb is None:
        kb = KnowledgeBase()
    n = name.strip().removeprefix("aten::").removeprefix("torch.").split(".")[0]
    key = f"aclnn:{n.lower()}" if n.startswith("aclnn") else f"op:{n}"
    rec = kb.aclnn_record(key)
    if rec is None:
        return None
    meta, source = rec
    doc = AclnnDoc(names=meta["names"], title="", products=meta["products"], params=meta["params"])
    c = chip_of(chip) if chip else None
    return DtypeSupport(
        names=doc.names,
        ops=list(meta.get("ops") or []),
        chip=c,
        supported_on_chip=doc.products.get(c) if c else None,
        dtypes=doc.dtypes(chip),
        source=source,
    )
