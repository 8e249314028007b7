"""The target registry (sandbox/targets/): one module per target, one record per chip; every reader
takes names from it and unknown names are refused with the known ones listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents.deploy.vllm import plan_serve
from agents.request import PortRequest
from agents.tuning.space import DEVICE_MEMORY_GIB, ModelFacts
from api.cli import app
from knowledge.errors import TargetError
from sandbox.ascend_sim.profiles import PROFILES, get_profile
from sandbox.targets import CHIP_REGISTRY, TARGETS, get_chip, resolve_target

ROOT = Path(__file__).resolve().parents[1]


def test_targets_and_chips_are_listed_once() -> None:
    assert tuple(TARGETS) == ("cpu", "ascend-sim", "npu", "auto")
    assert tuple(CHIP_REGISTRY) == ("910b", "a3", "310p")
    assert {n for n, s in TARGETS.items() if s.npu_like} == {"ascend-sim", "npu", "auto"}


@pytest.mark.parametrize(("call", "message"), [
    (lambda: resolve_target("tpu"), "unknown target 'tpu'; choose one of cpu, ascend-sim, npu, auto"),
    (lambda: resolve_target("cpu", chip="h100"), "unknown chip 'h100'; choose one of 910b, a3, 310p"),
    (lambda: get_chip("h100"), "unknown chip 'h100'"),
])
def test_unknown_names_are_refused_with_the_known_ones(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TargetError, match=message):
        call()


def test_request_cli_and_schema_read_the_registry() -> None:
    with pytest.raises(ValueError, match="unknown chip 'h100'"):
        PortRequest(model_path="m", chip="h100")
    schema = PortRequest.model_json_schema()["properties"]
    assert schema["target"]["enum"] == list(TARGETS) and schema["chip"]["enum"] == list(CHIP_REGISTRY)
    r = CliRunner().invoke(app, ["port", ".", "--chip", "h100"])
    assert r.exit_code == 2 and "unknown chip 'h100'" in r.output


def test_chip_facts_agree_with_the_emulator_profiles() -> None:
    """A profile per chip the emulator emulates (every chip today), keyed as the registry; the facts the
    emulator keeps a copy of are the chip record's."""
    assert set(PROFILES) == set(CHIP_REGISTRY)
    for key, chip in CHIP_REGISTRY.items():
        profile = PROFILES[key]
        assert profile.key == key and chip.memory_gib == profile.memory_gib and chip.bf16 == profile.bf16, key
    assert get_chip("Ascend 910B3").key == "910b" and get_chip("A2").key == "910b" and get_chip("310P3").key == "310p"


def test_every_chip_name_the_registry_accepts_runs_the_emulator_as_that_chip(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry alone resolves names (the emulator keeps no alias table of its own, which refused 910b1,
    910b2 and 910b4): each key and alias, through the target and through a request, installs the emulator
    with that chip's profile."""
    monkeypatch.setenv("NPUPORT_SIM_ENGINE", "python")  # no native build: the chip is what is checked here
    names = {name: key for key, chip in CHIP_REGISTRY.items() for name in (key, *chip.aliases, key.upper())}
    assert {"910b1", "910b2", "910b4"} <= set(names)
    options = []
    for name, key in names.items():
        target = resolve_target("ascend-sim", chip=name)
        assert PortRequest(model_path="m", chip=name).chip == target.options["chip"] == key, name
        options.append(target.options)
    with pytest.raises(ValueError, match="sandbox.targets.get_chip"):
        get_profile("910b3")  # an alias is the registry's to resolve
    code = ("import json, sys; from sandbox.ascend_sim import install, op_report\n"
            "for o in json.loads(sys.argv[1]):\n    install(o); r = op_report(); print(r['chip'], r['device_name'])")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(options)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:-1] == [f"{k} {PROFILES[k].device_name}" for k in names.values()]


def test_serve_defaults_and_memory_come_from_the_chip() -> None:
    assert DEVICE_MEMORY_GIB == {"910b": 64.0, "a3": 64.0, "310p": 24.0}
    facts = ModelFacts(hidden_size=64, num_layers=2, num_heads=4, vocab_size=100)
    dtype = {c: next(s.value for s in plan_serve(facts, chip=c) if s.name == "dtype") for c in CHIP_REGISTRY}
    assert dtype == {"910b": "bfloat16", "a3": "bfloat16", "310p": "float16"}


def test_a_recorded_matrix_that_is_not_here_falls_back_to_this_hosts_and_says_so(tmp_path: Path,
                                                                                  sim_home: Path) -> None:
    """A bundle's report names the op matrix of the host it was ported on (under that NPUPORT_HOME); verify on
    another host, or after that home was removed, must not fail in the sandbox with FileNotFoundError: it uses
    this host's matrix of the same torch_npu (the session's, built from the real wheel)."""
    from agents.target_state import matrix_for

    mine, _ = matrix_for("2.13.0")
    assert mine is not None and Path(mine).is_file()
    gone = tmp_path / "old-home" / "matrices" / "torch_npu-2.13.0.json"
    t = resolve_target("ascend-sim", chip="910b", torch_npu="2.13.0", matrix_path=str(gone))
    assert t.options["matrix_path"] == mine
    # its own key: an env with another torch rewrites engine_note (agents/environment/layered.py native_for)
    assert str(gone) in t.options["matrix_note"] and "this host's" in t.options["matrix_note"]
    assert str(gone) not in t.options["engine_note"] and str(gone) in (t.reason or "")
    sim = subprocess.run([sys.executable, "-c", "import json, sys; from sandbox.ascend_sim import install, op_report; "
                          "install(json.loads(sys.argv[1])); print(op_report()['matrix_note'])",
                          json.dumps(t.options)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert str(gone) in sim.stdout and mine in sim.stdout, sim.stderr[-2000:]  # the run's op report says it too
    here = tmp_path / "m.json"
    here.write_text("{}")
    assert resolve_target("ascend-sim", chip="910b", torch_npu="2.13.0",
                          matrix_path=str(here)).options["matrix_path"] == str(here)
