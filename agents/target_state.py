"""The op-support matrix a target needs (the environment node fetches it; agents/state.py reads the resolved
target back from the state)."""

from __future__ import annotations

from knowledge.errors import first_line


def matrix_for(version: str) -> tuple[str | None, str]:
    """Path of the op-support matrix JSON for a torch_npu version, built from the wheel when needed.
    Without a matrix the emulator falls back to its small built-in policy, and the report says so."""
    try:
        from knowledge import op_matrix
    except ImportError as exc:  # knowledge.op_matrix is optional at this layer
        return None, f"no op-support matrix module ({exc})"
    from agents.request import known_torch_npu

    try:
        known_torch_npu(version)  # a download of that release's wheel follows: the table's releases only
    except ValueError as exc:
        return None, str(exc)
    try:
        path = op_matrix.matrix_path(version)
        if not path.is_file():
            op_matrix.load_or_build(version)  # downloads the wheel once, reads it as files
    except Exception as exc:  # network or wheel problems must not stop the port
        return None, f"op-support matrix for torch_npu {version} unavailable: {first_line(exc)}"
    return str(path), f"op-support matrix of torch_npu {version} from {path}"
