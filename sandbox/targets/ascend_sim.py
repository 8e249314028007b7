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
    from sandbox.ascend_sim.profiles import PROFILES

    if chip not in PROFILES:  # a chip only a real NPU runs has a record and no profile
        raise TargetError(f"ascend-sim does not emulate the chip {chip!r}; it emulates {', '.join(PROFILES)}",
                          value=chip, choices=list(PROFILES))

    try:
        engine, lib, why = choose_engine(settings().sim_engine or "auto", log=_log)
    except (NativeUnavailable, ValueError) as e:
        raise TargetError(f"ascend-sim: {e}") from e
    if matrix_path and not Path(matrix_path).is_file():
        # a bundle's report names the matrix of the host (and NPUPORT_HOME) it was ported on: verified elsewhere,
        # or after that home was cleaned, this host's matrix of the same torch_npu is used, and said
        from knowledge.op_matrix import matrix_path as host_matrix

        here = host_matrix(torch_npu)
        if here.is_file():
            matrix_note = f"the recorded matrix {matrix_path} is not here; this host's for torch_npu {torch_npu} " \
                          f"({here}) is used"
        else:
            matrix_note = f"the recorded matrix {matrix_path} is not here, nor one for torch_npu {torch_npu} on this " \
                          "host: the built-in minimal policy is used"
        _log(matrix_note)
        matrix_path = str(here) if here.is_file() else None
    else:
        matrix_note = None
    # the matrix's note has its own key: an env with its own torch rebuilds the engine and rewrites engine_note
    # (agents/environment/layered.py native_for)
    options = {"chip": chip, "torch_npu": torch_npu, "matrix_path": matrix_path, "strict": strict,
               "engine": engine, "native_lib": lib, "engine_note": why, "matrix_note": matrix_note}
    env = {"TORCH_NPU_FALLBACK_CPU_DISABLE": "1"} if strict else {}
    reason = f"requested; {why}" + (f"; {matrix_note}" if matrix_note else "")
    return Target("ascend-sim", "npu", "sandbox.ascend_sim:install", options, env, reason=reason)


SPEC = TargetSpec(name="ascend-sim", summary="an emulated Ascend host on any CPU", npu_like=True, resolve=resolve,
                  uses_matrix=True, emulated=True,
                  script=ScriptSetup(device="npu", bootstrap="sandbox.ascend_sim:install",
                                     options=("chip", "torch_npu"),
                                     needs_npuport=True))
