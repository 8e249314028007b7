"""An op-support matrix (knowledge/op_matrix.py's JSON) as short fact chunks for the knowledge base."""

from __future__ import annotations

from knowledge.kb.chunking import digest
from knowledge.kb.identifiers import op_key
from knowledge.kb.models import Chunk


def matrix_chunks(matrix: dict, root_key: str, path: str) -> list[Chunk]:
    """Short fact records: per op (overloads together) kernel kind, aclnn name, dtypes; fallbacks."""
    ver = str(matrix.get("torch_npu_version", ""))
    src = f"op-matrix torch_npu-{ver}" if ver else "op-matrix"
    by_op: dict[str, list[tuple[str, dict]]] = {}
    for name, rec in (matrix.get("ops") or {}).items():
        by_op.setdefault(name.split(".")[0], []).append((name, rec if isinstance(rec, dict) else {}))
    chunks: list[Chunk] = []

    def fact(op: str, text: str, keys: list[str]) -> None:
        title = f"aten::{op} on torch_npu {ver}".strip()
        chunks.append(
            Chunk(
                id=f"{digest(root_key, op)}-0",
                collection="ascend_ops",
                title=title,
                text=text,
                embed_text=text,
                source=src,
                path=path,
                anchor=op,
                keys=keys,
                primary=keys[:1],
                version=ver,
                language="en",
                kind="op_fact",
            )
        )

    for op, recs in sorted(by_op.items()):
        parts, keys = [], [op_key(op)]
        for name, rec in recs:
            if not rec.get("npu", True):
                how = "runs on the CPU (fallback)" if rec.get("fallback") else "no NPU kernel"
                parts.append(f"{name}: {how}")
                if rec.get("fallback") and "env:TORCH_NPU_FALLBACK_CPU_DISABLE" not in keys:
                    keys.append("env:TORCH_NPU_FALLBACK_CPU_DISABLE")
                continue
            kernel = rec.get("kernel", "unknown")
            if kernel == "composite":
                parts.append(f"{name}: composite (decomposes into other ops, needs no NPU kernel)")
                continue
            exec_name = rec.get("exec") or ""
            dtypes = rec.get("dtypes")
            desc = f"{name}: NPU kernel ({kernel}{', ' + exec_name if exec_name else ''})"
            desc += f", dtypes {', '.join(map(str, dtypes))}" if dtypes else ", dtypes not listed"
            parts.append(desc)
            if exec_name and f"aclnn:{exec_name.lower()}" not in keys:
                keys.append(f"aclnn:{exec_name.lower()}")
        fact(op, f"aten::{op} in torch_npu {ver}: " + "; ".join(parts), keys)
    fallback = sorted({str(op).split(".")[0] for op in matrix.get("fallback_ops") or []} - set(by_op))
    for op in fallback:
        base = op
        fact(
            base,
            f"aten::{op} has no NPU kernel in torch_npu {ver}: it runs on the CPU through the fallback "
            "(a warning once per op), or raises when TORCH_NPU_FALLBACK_CPU_DISABLE=1.",
            [op_key(base), "env:TORCH_NPU_FALLBACK_CPU_DISABLE"],
        )
    for op in sorted({str(o) for o in matrix.get("custom_ops") or []}):
        chunks.append(
            Chunk(
                id=f"{digest(root_key, 'custom', op)}-0",
                collection="ascend_ops",
                title=f"torch_npu.{op} (custom op, torch_npu {ver})",
                text=f"torch_npu.{op} is a torch_npu custom op with an NPU kernel in {ver}.",
                embed_text=f"torch_npu.{op} custom NPU op",
                source=src,
                path=path,
                anchor=op,
                keys=[op_key(op)],
                primary=[op_key(op)],
                version=ver,
                kind="op_fact",
            )
        )
    return chunks
