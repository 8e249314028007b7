"""The real `npu` target (torch_npu on an Ascend NPU). Skips with the probe's stated reason where
torch_npu cannot import or sees no device: the NPU hardware is outside our walls."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.targets import probe_npu, resolve_target
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.npu

_ok, _why = probe_npu()


def test_probe_reports_a_reason_either_way() -> None:
    assert _why and isinstance(_ok, bool)
    t = resolve_target("auto")
    assert t.name == ("npu" if _ok else "ascend-sim") and t.reason.startswith("auto: ")


@pytest.mark.skipif(not _ok, reason=f"no usable NPU: {_why}")
def test_port_ocr_mini_on_a_real_npu(tmp_path: Path) -> None:  # pragma: no cover - needs hardware
    from graph.runner import run_port

    state = run_port({"request": {"model_path": str(EXAMPLES / "ocr_mini"), "target": "npu",
                                  "out_dir": str(tmp_path / "b")}}, "npu-test")
    assert state["status"] == "validated"
    run = [r for r in state["runs"] if r["purpose"] == "port"][-1]
    assert run["op_stats"]["target"] == "npu"
