"""``ascend-sim``: the emulated Ascend runtime (sandbox/ascend_sim) on the CPU, for a chosen torch_npu
version and chip, with the op-support matrix of that build."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from knowledge.errors import TargetError
from sandbox.targets.base import ScriptSetup, Target, TargetSpec


def _log(msg: str) -> None:
    print(f"npuport: {msg}", file=sys.stderr, flush=True)


def resolve(*, chip: str, torch_npu: str, strict: bool = False, matrix_path: str | None = None,
            **_: Any) -> Target:
    from knowledge.errors import NativeUnavailable
    from knowledge.settings import settings
    from sandbox.ascend_sim.native_build import choose_engine

    try:
        engine, lib, why = choose_engine(settings().sim_engine or "auto", log=_log)
    except (NativeUnavailable, ValueError) as e:
        raise TargetError(f"ascend-sim: {e}") from e
    if matrix_path and not Path(matrix_path).is_file():
        # a bundle's report names the matrix of the host (and NPUPORT_HOME) it was ported on: verified elsewhere,
        # or after that home was cleaned, this host's matrix of the same torch_npu is used, and said
        _log(f"the op-support matrix {matrix_path} is not here; using this host's for torch_npu {torch_npu}")
        why = f"{why}; the recorded matrix {matrix_path} is not here, this host's for torch_npu {torch_npu} is used"
        matrix_path = None
    options = {"chip": chip, "torch_npu": torch_npu, "matrix_path": matrix_path, "strict": strict,
               "engine": engine, "native_lib": lib, "engine_note": why}
    env = {"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"} if strict else {}
    return Target("ascend-sim", "npu", "sandbox.ascend_sim:install", options, env, reason=f"requested; {why}")


SPEC = TargetSpec(name="ascend-sim", summary="an emulated Ascend host on any CPU", npu_like=True, resolve=resolve,
                  uses_matrix=True, emulated=True,
                  script=ScriptSetup(device="npu", bootstrap="sandbox.ascend_sim:install", options=("chip", "torch_npu"),
                                     needs_npuport=True))
