"""Model zoos for the batch tests: tiny CUDA-only models (tests/tiny_models.py) as a folder, as a
.tar.gz archive with shrink overrides, one that fails, and one that hangs."""

from __future__ import annotations

import tarfile
from pathlib import Path

from tests.tiny_models import write_tiny_model

FAILS = 'raise ValueError("an op no recipe covers")'


def write_zoo(root: Path, *, hang: bool = False) -> Path:
    """Three models (two that validate, one that fails) and batch.yaml; returns the manifest."""
    write_tiny_model(root / "alpha")
    staged = write_tiny_model(root / "src" / "beta")
    # the archive's config is shrunk by the batch (vocab 32 -> 24) in its staged copy
    (staged / "npuport.yaml").write_text((staged / "npuport.yaml").read_text() + "shrink: {vocab: 24}\n")
    with tarfile.open(root / "beta.tar.gz", "w:gz") as tf:
        tf.add(staged, arcname="beta")
    write_tiny_model(root / "gamma", twist="import time; time.sleep(40)" if hang else FAILS)
    manifest = root / "batch.yaml"
    manifest.write_text(
        "name: zoo\n"
        "defaults:\n"
        "  target: cpu\n"
        "  budget: {max_runs: 2, run_timeout_s: 180}\n"
        "  timeout_s: 480\n"  # room for a loaded two-worker CI box; only gamma's 12 s is tested
        "models:\n"
        "  - path: alpha\n"
        "  - path: beta.tar.gz\n"
        "    shrink: true\n"
        "  - path: gamma\n" + ("    timeout_s: 12\n" if hang else ""))
    return manifest
