"""Adding a hazard class, a target or a chip is one new file plus one registry line (docs/architecture.md).

The toy ones live in tests/fixtures (toy_rule.py: hazard H90; toy_target.py: target "toy-host";
toy_chip.py: chip "t1"); each test registers them with one line per registry, exactly what a real
addition writes into agents/rules/registry.py or sandbox/targets/registry.py, and then shows that every
reader picks them up with no other change: the request, the batch manifest, the LLM's prompts and
answer checks, the tuner's constraints, the bundle's run.py and report, and (slow) a whole port
through the graph whose bundle's run.py runs on the toy target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.llm.prompts import load_prompt
from agents.request import PortRequest, parse_goal, request_of
from agents.rules.registry import DEFAULT, active, use_registry
from sandbox.targets import registry
from tests.fixtures import toy_chip, toy_rule, toy_target
from tests.llm_stub import ai_tool_call
from tests.test_llm_policy import no_llm_env, policy_for, ws  # noqa: F401  (fixtures)

TOY_REGISTRY = DEFAULT.with_rules(toy_rule.RULE)


@pytest.fixture()
def toys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one registry line each for the toy target and the toy chip."""
    monkeypatch.setitem(registry.TARGETS, toy_target.SPEC.name, toy_target.SPEC)
    monkeypatch.setitem(registry.CHIPS, toy_chip.CHIP.key, toy_chip.CHIP)


def test_the_request_and_the_batch_manifest_take_a_new_target_and_chip(toys: None, tmp_path: Path) -> None:
    from graph.batch.manifest import load_manifest

    req = PortRequest(model_path="m", target="toy-host", chip="toy1")  # an alias reads as its chip
    assert (req.target, req.chip) == ("toy-host", "t1")
    with pytest.raises(ValueError, match="choose one of"):
        PortRequest(model_path="m", target="toy-nowhere")
    (tmp_path / "m").mkdir()
    (tmp_path / "batch.yaml").write_text("defaults: {target: toy-host, chip: t1}\nmodels:\n  - path: m\n")
    (port,) = load_manifest(tmp_path / "batch.yaml").ports
    assert (port.settings.target, port.settings.chip) == ("toy-host", "t1")
    goal = parse_goal("port ./m --target toy-host to Ascend T1")
    assert (goal.target, goal.chip) == ("toy-host", "t1")


def test_capabilities_not_names_decide_for_a_new_target(toys: None) -> None:
    from agents.tuning.constraints import _compile, _layout
    from agents.tuning.space import HostFacts

    facts = HostFacts(target="toy-host", chip="t1", cores=2, memory_bytes=2**33)
    assert not facts.on_device and facts.device_memory_bytes == 2**33  # host memory: it is not a device
    assert "toy-host target provides no torch.compile backend" in (_compile({"compile": "default"}, facts) or "")
    assert "the toy-host target has none" in (_layout({"attention_op": "npu_fused_infer_attention_score",
                                                       "input_layout": "BNSD"}, facts) or "")
    assert registry.get_chip("t1").memory_gib == 8.0 and not registry.get_chip("t1").bf16
    planner = load_prompt("planner")  # the LLM planner is offered the new target and chip
    assert '"toy-host" (a toy target on the host CPU)' in planner
    assert '"t1" (Toy T1 inference card; also toy1)' in planner


def test_the_bundle_offers_a_new_target_and_names_a_new_chip(toys: None) -> None:
    from agents.deploy.runscript import render_run_py, script_table
    from agents.report.markdown import _chip_text

    table = script_table({"model_path": "m", "chip": "t1"})
    assert table["toy-host"] == {"device": "cpu", "imports": [], "bootstrap": None, "options": {}}
    assert table["ascend-sim"]["options"]["chip"] == "t1"  # the emulator emulates the port's chip, not 910b
    text = render_run_py({}, "toy-host", {}, {"model_path": "m", "chip": "t1"})
    assert "TUNED_TARGET = 'toy-host'" in text and '"toy-host"' in text
    assert _chip_text("t1") == "t1 (Toy T1 inference card)"  # the report's chip line (the slow test reads report.md)


def test_the_cli_accepts_a_target_and_chip_registered_after_import(toys: None, tmp_path: Path) -> None:
    """The CLI checks a flag against the registries when the command runs, not when api.cli is imported."""
    from typer.testing import CliRunner

    from api.cli import app

    out = CliRunner().invoke(app, ["ops", str(tmp_path / "missing"), "--target", "toy-host", "--chip", "t1"])
    assert "unknown target" not in out.output and "unknown chip" not in out.output
    assert "not a model folder" in out.output  # past the choices, at the folder check
    out = CliRunner().invoke(app, ["ops", str(tmp_path), "--target", "toy-nowhere"])
    assert out.exit_code == 2 and "unknown target 'toy-nowhere'" in out.output


def test_the_llm_path_reads_the_hazard_classes_from_the_registry(ws: Any) -> None:  # noqa: F811
    with use_registry(TOY_REGISTRY):
        prompt = load_prompt("code_reader")
        assert f"- H90 {toy_rule.RULE.title}" in prompt and "- H17 " in prompt and "{hazard_classes}" not in prompt
        assert f"- H90 {toy_rule.RULE.title}" in load_prompt("patcher")
        missed = {"rule": "toy", "file": "mod.py", "line": 8, "message": "toy", "category": "slows down",
                  "severity": "low"}
        wrong = ai_tool_call("ReviewAnswer", {"findings": [{**missed, "hazard": "H99"}]}, "r1")
        right = ai_tool_call("ReviewAnswer", {"findings": [{**missed, "hazard": "H90"},
                                                           {**missed, "hazard": "H15", "line": 7}]}, "r2")
        policy, chat = policy_for(ws, [wrong, right])
        found = policy.review_findings([])
        assert "'H99' is not a hazard class" in str(chat.seen[1][-1].content)
        assert sorted(f.hazard for f in found) == ["H15", "H90"]  # H12-H17 were refused before
    assert active() is DEFAULT and "H90" not in load_prompt("code_reader")


def _toy_model(root: Path) -> Path:
    from tests.test_rules import TOY_MANIFEST, TOY_MODEL

    root.mkdir()
    (root / "npuport.yaml").write_text(TOY_MANIFEST)
    (root / "config.json").write_text(json.dumps({"vocab": 32}))
    (root / "modeling_toy.py").write_text(TOY_MODEL)
    return root


@pytest.mark.slow
def test_a_toy_hazard_target_and_chip_port_through_the_graph_into_a_runnable_bundle(
        toys: None, tmp_path: Path, npuport_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    model = _toy_model(tmp_path / "toy")
    out = tmp_path / "bundle"
    with use_registry(TOY_REGISTRY):
        state = run_port({"request": {"model_path": str(model), "target": "toy-host", "chip": "t1",
                                      "policy": "rule", "out_dir": str(out)}}, "toy-all")
    assert state["status"] == "validated", state.get("reason")
    assert state["target"]["name"] == "toy-host" and state["target"]["options"] == {"chip": "t1"}
    assert request_of(state).chip == "t1"
    assert [f["rule"] for f in state["findings"] if f["hazard"] == "H90"] == ["toy-sync-call"]
    assert {p["codemod"] for p in state["patches"]} >= {"toy-drop-sync", "toy-drop-device-move"}
    assert "t1 (Toy T1 inference card)" in (out / "report.md").read_text()
    # the bundle's run.py runs the patched model on the toy target, standalone
    r = subprocess.run([sys.executable, str(out / "run.py"), "--repeats", "1"], capture_output=True, text=True,
                       timeout=300, cwd=out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"tokens {state['numerics']['port_tokens'][0]}" in r.stdout  # the tokens the port validated
    assert "\ntarget toy-host batch" in r.stdout and "tokens/s" in r.stdout
