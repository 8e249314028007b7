"""The CUDA-only libraries, re-exported for the agents: the one table lives in ``sandbox.cuda_only``
(the sandbox needs it too and may not import agents/)."""

from __future__ import annotations

from sandbox.cuda_only import (
    BY_MODULE,
    CUDA_ONLY_DISTS,
    CUDA_ONLY_ROOTS,
    LIBRARIES,
    STUB_ROOTS,
    CudaOnlyLibrary,
)

CUDA_ONLY = CUDA_ONLY_ROOTS  # the name the agents used before the table moved

__all__ = ["BY_MODULE", "CUDA_ONLY", "CUDA_ONLY_DISTS", "CUDA_ONLY_ROOTS", "LIBRARIES", "STUB_ROOTS",
           "CudaOnlyLibrary"]
