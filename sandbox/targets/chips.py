"""The Ascend chips npuport knows. Add a chip: one ``Chip`` record here (and, for the emulator, a
profile in sandbox/ascend_sim/profiles.py); docs/architecture.md, "Add a chip"."""

from __future__ import annotations

from sandbox.targets.base import Chip

_MATRIX = "op-plugin matrix of the torch_npu build (knowledge/op_matrix.py)"

CHIPS: tuple[Chip, ...] = (
    Chip(key="910b", product="Atlas A2 training/inference series (Atlas 800T/800I A2)", memory_gib=64.0,
         dtypes=("float32", "float16", "bfloat16"), op_support=_MATRIX, serve_dtype="bfloat16",
         aliases=("a2", "910b3", "910b1", "910b2", "910b4")),
    Chip(key="a3", product="Atlas A3 training/inference series (Atlas 800T/800I A3, super-pod)", memory_gib=64.0,
         dtypes=("float32", "float16", "bfloat16"), op_support=_MATRIX, serve_dtype="bfloat16"),
    Chip(key="310p", product="Atlas 300I Pro / 300I Duo inference cards", memory_gib=24.0,
         dtypes=("float32", "float16"), op_support=_MATRIX + "; no bfloat16 kernels, many fused ops are A2/A3 only",
         serve_dtype="float16", aliases=("310p3",),
         serve_note="Ascend 310P has no bfloat16 kernels, so it serves float16", doc_words=("310p", "300i")),
)
