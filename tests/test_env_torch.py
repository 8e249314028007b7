"""The torch pair a model importing torchvision runs on (agents/environment/torch_pair.py): candidate pairs from a
package index listing (faked here: the index is outside our walls), pip's constraints, the order of
the fallbacks, and the probe that proves a pair by running a native op. Installing a real pair (GBs)
is opt-in: NPUPORT_TEST_TORCH_PAIR=1."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agents.environment import torch_pair as et
from agents.environment.compat import load_compat
from agents.environment.resolution import bundle_files
from agents.environment.resolve import resolve

INDEX = {
    "torch": ["2.15.0", "2.14.1", "2.14.0", "2.13.0+cpu", "2.13.0", "2.12.0", "2.14.0rc1"],
    "torchvision": ["0.30.0", "0.29.1", "0.29.0", "0.28.0", "0.27.0"],
    "torchaudio": ["2.14.0", "2.13.0"],
}


def fake_index(name: str) -> list[str]:
    return INDEX[name]


def test_candidate_pairs_pair_lines_honour_constraints_and_prefer_the_host_release() -> None:
    compat = load_compat()
    pairs = et.candidate_pairs(["torchvision"], "2.13.0+cpu", fake_index, compat,
                               ["torch<=2.14.1", "torchvision<=0.29.1"])
    # The host's torch release first, then the newest the constraints allow; each with its line's newest companion.
    assert pairs[0] == ("2.13.0", {"torchvision": "0.28.0"})
    assert pairs[1] == ("2.14.1", {"torchvision": "0.29.1"})
    assert ("2.15.0", {"torchvision": "0.30.0"}) not in pairs  # above the constraint
    assert all(not t.endswith("rc1") for t, _ in pairs)
    both = et.candidate_pairs(["torchaudio", "torchvision"], None, fake_index, compat, [])
    assert both[0] == ("2.14.1", {"torchaudio": "2.14.0", "torchvision": "0.29.1"})  # 2.15 has no torchaudio


def test_choose_pair_records_why_the_host_line_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []

    def overlay(chosen: dict[str, str], host_torch: str, python: str, root: Path, log: object) -> tuple[bool, str]:
        calls.append(("overlay", *sorted(chosen.values())))
        return False, "RuntimeError: operator torchvision::nms does not exist"

    def base(torch_v: str, chosen: dict[str, str], root: Path, log: object) -> tuple[Path, str]:
        calls.append(("base", torch_v, *sorted(chosen.values())))
        return root / "env" / "bin" / "python", json.dumps({"torch": torch_v, **chosen})

    monkeypatch.setattr(et, "_try_overlay", overlay)
    monkeypatch.setattr(et, "ensure_base_env", base)
    monkeypatch.setattr(et, "_host_has", lambda dist: None)
    pair = et.choose_pair(["torchvision"], sys.executable, "2.13.0+cpu", load_compat(), tmp_path, lambda m: None,
                          index=fake_index, constraints=["torch<=2.14.1", "torchvision<=0.29.1"])
    # The host's line was tried first (cheap), proved broken, so it is not tried again as a full pair.
    assert calls == [("overlay", "0.28.0"), ("base", "2.14.1", "0.29.1")]
    assert pair.source == "index" and pair.torch == "2.14.1" and pair.companions == {"torchvision": "0.29.1"}
    assert "operator torchvision::nms does not exist" in pair.reason

    # The choice is remembered: the next port neither probes nor builds again (while its base env exists).
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / et.BASE_MARKER).write_text("{}")
    again = et.choose_pair(["torchvision"], sys.executable, "2.13.0+cpu", load_compat(), tmp_path, lambda m: None,
                           index=fake_index, constraints=["torch<=2.14.1", "torchvision<=0.29.1"])
    assert again == pair and len(calls) == 2
    calls.clear()

    def base_fails_first(torch_v: str, chosen: dict[str, str], root: Path, log: object) -> tuple[Path, str]:
        calls.append(("base", torch_v))
        if torch_v == "2.14.1":
            raise et.EnvBuildError("installed but does not load together: operator torchvision::nms does not exist")
        return root / "env" / "bin" / "python", "ok"

    monkeypatch.setattr(et, "ensure_base_env", base_fails_first)
    pair = et.choose_pair(["torchvision"], sys.executable, None, load_compat(), tmp_path, lambda m: None,
                          index=fake_index, constraints=["torch<=2.14.1", "torchvision<=0.29.1"])
    # No host torch: the newest allowed pair first; when it fails the next is tried and the failure kept.
    assert calls == [("base", "2.14.1"), ("base", "2.14.0")]
    assert (pair.torch, pair.companions) == ("2.14.0", {"torchvision": "0.29.1"})
    assert "torch 2.14.1 + torchvision 0.29.1" in pair.reason and pair.base_env


def test_choose_pair_fails_with_every_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(et, "_host_has", lambda dist: None)
    monkeypatch.setattr(et, "_try_overlay", lambda *a: (False, "ImportError: libtorch_cuda.so"))

    def broken(torch_v: str, chosen: dict[str, str], root: Path, log: object) -> tuple[Path, str]:
        raise et.EnvBuildError(f"pip exit 1 for {torch_v}")

    monkeypatch.setattr(et, "ensure_base_env", broken)
    with pytest.raises(et.EnvBuildError) as err:
        et.choose_pair(["torchvision"], sys.executable, "2.13.0", load_compat(), tmp_path, lambda m: None,
                       index=fake_index, constraints=[])
    assert "libtorch_cuda.so" in str(err.value) and "pip exit 1 for 2.15.0" in str(err.value)
    assert "pip exit 1 for 2.13.0" not in str(err.value)  # the host release was not retried as a full pair


def test_probe_runs_a_native_op_and_reports_the_error() -> None:
    ok, out = et.probe(sys.executable, ["torchvision"], extra_path=[])
    try:
        import torchvision  # noqa: F401
    except Exception:
        assert not ok and out  # no loadable torchvision here: the error's last line
    else:
        assert ok and json.loads(out)["torchvision"]


def test_resolution_lists_imported_companions_and_bundle_pins_the_pair(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_x.py").write_text("import torch\nfrom torchvision import transforms\nimport einops\n")
    res = resolve(model, "cpu", None)
    assert res.companions == ["torchvision"] and res.needs_layered_env
    assert not any(i.startswith("torchvision") for i in res.install)
    pair = {"torch": "2.14.1", "companions": {"torchvision": "0.29.1"}}
    req, con = bundle_files("cpu", dict(res.stack), res.pins, load_compat(), pair)
    assert "torch==2.14.1" in con.splitlines() and "torchvision==0.29.1" in con.splitlines()
    assert "torchvision==0.29.1" in req.splitlines()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NPUPORT_TEST_TORCH_PAIR") != "1",
                    reason="installs a real torch pair (GBs); opt in with NPUPORT_TEST_TORCH_PAIR=1")
def test_real_pair_is_chosen_built_and_proven(tmp_path: Path) -> None:
    from agents.environment.compat import host_version
    from agents.environment.layered import env_cache_root

    pair = et.choose_pair(["torchvision"], sys.executable, host_version("torch"), load_compat(), env_cache_root(),
                          print)
    assert "torchvision" in json.loads(pair.proof)


def test_native_engine_key_follows_the_torch_of_the_interpreter_that_runs_the_sandbox(tmp_path: Path) -> None:
    from sandbox.ascend_sim import native_build as nb

    # An interpreter with another torch build (a torch pair's env), faked by a script that answers the probe.
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\necho '2.99.1+cu130|1|3.11.7 (main)'\n")
    other.chmod(0o755)
    nb._torch_identity.cache_clear()
    assert nb.build_key(sys.executable) == nb.build_key()
    assert nb.build_key(str(other)) != nb.build_key()
    assert nb._torch_identity(str(other))[0] == "2.99.1+cu130"


def test_the_sandbox_binds_a_layered_envs_base_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.isolation.bwrap import _interpreter_paths

    monkeypatch.setenv("NPUPORT_ENV_CACHE", str(tmp_path))  # a layer is bound only when it is an env of the cache

    base, env = tmp_path / "base", tmp_path / "layered"
    for d in (base, env):
        (d / "bin").mkdir(parents=True)
        (d / "bin" / "python").symlink_to(sys.executable)
    (env / "npuport-env.json").write_text(json.dumps({"layers": [str(base)]}))
    paths = _interpreter_paths(str(env / "bin" / "python"))
    assert env in paths and base in paths  # under a masked home the base env is invisible unless bound
