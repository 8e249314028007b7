"""The original's own failures (agents/validation/original_failure.py): the model fails by itself only where the
original fails the same way for a reason of its own; an error npuport's run code raises is npuport's."""

from __future__ import annotations

from pathlib import Path

import sandbox
from agents.models import Frame, RunRecord, StructuredException
from agents.validation.original_failure import same_failure

HARNESS = Path(sandbox.__file__).resolve().parent


def _failed(purpose: str, *frames: Frame) -> RunRecord:
    exc = StructuredException(type="ValueError", message="invalid literal for int() with base 10: 'None'",
                              frames=list(frames))
    return RunRecord(id=purpose, purpose=purpose, target="cpu", ok=False, status="error", wall_s=1.0,  # type: ignore[arg-type]
                     result_path="", exception=exc)


def test_an_error_npuports_input_builder_raises_is_not_the_models() -> None:
    worker = Frame(file=str(HARNESS / "harness" / "worker.py"), line=252)
    inputs = Frame(file=str(HARNESS / "inputs" / "model_inputs.py"), line=336)
    port, original = _failed("port", worker, inputs), _failed("reference", worker, inputs)
    assert same_failure(port, original, lambda site: site) is None


def test_the_same_error_outside_npuports_code_is_still_the_originals() -> None:
    worker = Frame(file=str(HARNESS / "harness" / "worker.py"), line=252)
    library = Frame(file="/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line=1544)
    assert same_failure(_failed("port", worker, library), _failed("reference", worker, library),
                        lambda site: site) == "outside the model's files"
    model = Frame(file="modeling_x.py", line=12, in_model=True)
    assert same_failure(_failed("port", worker, model), _failed("reference", worker, model),
                        lambda site: site) == "modeling_x.py:12"
