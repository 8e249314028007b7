"""One small config per port: the config the port's runs built (the harness result's ``shrunk_config``, the
bundle's run_config.json) is what verify and the deployment build again, never a config derived anew."""

from __future__ import annotations

import json
from pathlib import Path

from agents.models import RunRecord
from agents.runs import RUN_CONFIG_NAME, run_config_of
from sandbox.harness.model_build import load_config


def _run(tmp_path: Path, name: str, ok: bool, result: dict[str, object] | None) -> dict[str, object]:
    path = tmp_path / f"{name}.json"
    if result is not None:
        path.write_text(json.dumps(result))
    return RunRecord(id=name, purpose="port", target="cpu", ok=ok, status="ok" if ok else "error", wall_s=1.0,
                     result_path=str(path)).model_dump(mode="json")


def test_the_run_config_is_the_last_good_port_run_s_and_the_bundle_s_copy_wins(tmp_path: Path) -> None:
    first, last = {"hidden_size": 64, "num_hidden_layers": 2}, {"hidden_size": 32, "num_hidden_layers": 2}
    state = {"runs": [_run(tmp_path, "run-1", True, {"shrunk_config": first}),
                      _run(tmp_path, "run-2", True, {"shrunk_config": last}),
                      _run(tmp_path, "run-3", False, {"shrunk_config": {"hidden_size": 8}})]}
    assert run_config_of(state) == last  # the last run that succeeded, not a failed one after it
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert run_config_of(state, bundle) == last  # no run_config.json in the bundle: the runs' record
    (bundle / RUN_CONFIG_NAME).write_text(json.dumps({"hidden_size": 16}))
    assert run_config_of(state, bundle) == {"hidden_size": 16}  # `npuport deploy` / verify have the bundle alone
    assert run_config_of({"runs": [_run(tmp_path, "run-4", True, {})]}) is None  # ran config.json as written
    assert run_config_of({}) is None


def test_the_harness_builds_the_run_config_as_it_is(tmp_path: Path) -> None:
    """Given the config the port ran with, the harness derives nothing: not even config.json is read."""
    small = {"model_type": "x", "hidden_size": 32, "num_hidden_layers": 2}
    config, changes = load_config(tmp_path / "no-such-model", {"shrink": {"hidden_size": 4}}, shrink=True,
                                  overrides={"use_cache": False}, run_config=small)
    assert config == {**small, "use_cache": False} and "run_config.json" in changes[0]
    assert small == {"model_type": "x", "hidden_size": 32, "num_hidden_layers": 2}  # the caller's dict untouched
