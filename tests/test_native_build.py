"""Choosing and building ascend-sim's native engine (sandbox/ascend_sim/native_build.py).

The real build is exercised by every ascend-sim test (and cached); these cases cover the choice and
the failure paths without compiling.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from knowledge.errors import NativeUnavailable
from sandbox.ascend_sim.native_build import cached_library, choose_engine, library_path


def test_python_engine_when_requested() -> None:
    assert choose_engine("python") == ("python", None, "python engine requested")


def test_no_compiler_falls_back_to_python_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_NATIVE_CACHE", str(tmp_path))  # nothing built there
    monkeypatch.setenv("CXX", "no-such-compiler-npuport")
    engine, lib, why = choose_engine("auto")
    assert (engine, lib) == ("python", None)
    assert "no C++ compiler (no-such-compiler-npuport)" in why
    with pytest.raises(NativeUnavailable, match="no C\\+\\+ compiler"):
        choose_engine("native")
    with pytest.raises(NativeUnavailable, match="not built yet"):
        library_path(build=False)


def test_unknown_engine_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown ascend-sim engine 'fast'"):
        choose_engine("fast")


def test_built_library_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = library_path()  # built once per torch + source (other tests usually built it already)
    assert cached_library() == first
    monkeypatch.setenv("CXX", "no-such-compiler-npuport")  # a cached build needs no compiler
    assert choose_engine("auto") == ("native", str(first), "native engine (C++ PrivateUse1 backend)")
