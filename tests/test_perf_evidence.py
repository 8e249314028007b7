"""Decode profile + pathology findings on tiny generative models that each plant one pathology
(tests/fixtures/perf_models/*/modeling_perf.py, line marked "# PLANTED"), run in real sandboxed
harness runs on the CPU and on ascend-sim. Nothing is faked."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.validation.perf_evidence import analyse, find_pathologies, summary_lines, verdict
from sandbox.harness.runner import run_harness
from sandbox.targets import Target, resolve_target

MODELS = Path(__file__).parent / "fixtures" / "perf_models"
_RUNS: dict[tuple[str, str], dict[str, Any]] = {}


def _planted_line(name: str, root: Path = MODELS) -> str:
    lines = (root / name / "modeling_perf.py").read_text().splitlines()
    return f"modeling_perf.py:{next(i + 1 for i, ln in enumerate(lines) if '# PLANTED' in ln)}"


def profile_of(name: str, target: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if (name, target) not in _RUNS:
        root = tmp_path_factory.mktemp(f"{name}-{target}")
        model = root / "model"
        shutil.copytree(MODELS / name, model)
        manifest = yaml.safe_load((model / "npuport.yaml").read_text())
        tgt = Target("cpu", "cpu") if target == "cpu" else resolve_target("ascend-sim")
        run = run_harness(workdir=root, model_dir=model, run_dir=root / "run", manifest=manifest, target=tgt)
        assert run.ok, run.result.get("exception")
        _RUNS[(name, target)] = run.result["profile"]
    return _RUNS[(name, target)]


TARGETS = ["cpu", "ascend-sim"]


@pytest.mark.parametrize("target", TARGETS)
def test_clean_model_has_no_pathology_and_a_full_profile(target: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    prof = profile_of("clean", target, tmp_path_factory)
    assert prof["error"] is None
    steps = prof["steps"]
    assert len(steps) == 8 and [s["input_len"] for s in steps] == [6] + [1] * 7  # KV cache: one position per step
    # The cache the steps return grows by one position (k and v, 16 floats each) per step.
    sizes = [s["cache_bytes"] for s in steps]
    assert all(b - a == 2 * 16 * 4 for a, b in zip(sizes, sizes[1:], strict=False))
    assert prof["modules"]["encoder"]["calls"] == 1 and prof["modules"]["encoder"]["steps"] == []
    assert find_pathologies(prof) == []
    if target == "ascend-sim":
        assert prof["counters"] == "device-ops" and all(s["ops"] > 0 for s in steps)
    perf = analyse(prof, prof)
    assert verdict("validated", perf) == "validated" and summary_lines(perf) == []


@pytest.mark.parametrize("target", TARGETS)
def test_no_kv_cache_is_found_at_the_step_call(target: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    prof = profile_of("no_kv_cache", target, tmp_path_factory)
    found = find_pathologies(prof)
    assert [f.kind for f in found] == ["no-kv-cache"]
    f = found[0]
    assert f.where == _planted_line("no_kv_cache")
    assert f.numbers["input_len_per_step"] == list(range(6, 14))
    assert "receives None at every decode step" in f.cause  # forward takes past_key_values; the loop drops it


@pytest.mark.parametrize("target", TARGETS)
def test_encoder_every_step_is_found_with_its_call_line(target: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    prof = profile_of("encoder_every_step", target, tmp_path_factory)
    found = find_pathologies(prof)
    assert [(f.kind, f.module) for f in found] == [("submodule-every-step", "encoder")]  # not its children
    assert found[0].where == _planted_line("encoder_every_step")
    assert found[0].numbers == {"calls_per_generate": 8, "steps": 8}


@pytest.mark.parametrize("target", TARGETS)
def test_per_step_item_sync_is_found_at_its_line(target: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    prof = profile_of("item_sync", target, tmp_path_factory)
    found = find_pathologies(prof)
    assert [f.kind for f in found] == ["step-loop-syncs"]
    assert found[0].where == _planted_line("item_sync")
    assert found[0].numbers["per_decode_step"] == [1] * 7
    assert found[0].fix and found[0].fix.startswith("H6")


@pytest.mark.parametrize("target", TARGETS)
def test_per_step_cpu_fallback_is_found_on_ascend_sim(target: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    prof = profile_of("cpu_fallback", target, tmp_path_factory)
    found = find_pathologies(prof)
    if target == "cpu":
        assert found == []  # the CPU has no fallbacks: this one only shows on an (emulated) NPU
        return
    assert [f.kind for f in found] == ["step-loop-fallbacks"]
    assert found[0].where == _planted_line("cpu_fallback")
    assert "isneginf" in next(iter(found[0].numbers["sites"]))
    assert found[0].fix and found[0].fix.startswith("H7")


@pytest.mark.parametrize("target", TARGETS)
def test_whole_output_decode_is_found_at_the_stop_check(target: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    prof = profile_of("whole_decode", target, tmp_path_factory)
    found = {f.kind: f for f in find_pathologies(prof)}
    # The stop check needs the tokens on the host: its .tolist() is a per-step sync at the same line.
    assert set(found) == {"whole-output-decode", "step-loop-syncs"}
    f = found["whole-output-decode"]
    assert f.where == found["step-loop-syncs"].where == _planted_line("whole_decode")
    assert f.numbers["decoded_lengths"] == list(range(1, 9))


def test_verdict_counts_pathologies_and_marks_inherited_ones(tmp_path_factory: pytest.TempPathFactory) -> None:
    port = profile_of("item_sync", "ascend-sim", tmp_path_factory)
    perf = analyse(port, profile_of("item_sync", "cpu", tmp_path_factory))
    assert verdict("validated", perf) == "validated, with 1 performance pathology"
    assert verdict("failed", perf) == "failed"
    assert perf["pathologies"][0]["in_original"] is True
    assert len(perf["rows"]) == 8 and perf["rows"][3]["syncs"] == 1 and perf["rows"][3]["ref_syncs"] == 1
    clean = analyse(port, profile_of("clean", "cpu", tmp_path_factory))
    assert clean["pathologies"][0]["in_original"] is False
    assert "introduced by the port" in summary_lines(clean)[0]


@pytest.mark.slow  # two whole ports and a verify: about a minute on a 2-core host
def test_port_verdict_strict_perf_plot_and_verify(npuport_home: Path, tmp_path: Path) -> None:
    import json

    from agents.deploy import verify_bundle
    from graph.runner import run_port

    # A copy written for CUDA, so the port has a patch to verify (an empty port.patch does not apply).
    model = tmp_path / "encoder_every_step"
    shutil.copytree(MODELS / "encoder_every_step", model)
    src = (model / "modeling_perf.py").read_text()
    (model / "modeling_perf.py").write_text(src.replace("device=x.device", 'device="cuda"'))
    out = tmp_path / "bundle"
    state = run_port({"request": {"model_path": str(model), "target": "cpu", "out_dir": str(out)}}, "perf-port")
    assert state["status"] == "validated", state.get("reason")
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "validated, with 1 performance pathology"
    # The line in the port's code (the patcher inserted helpers above it).
    assert report["perf"]["pathologies"][0]["where"] == _planted_line("patched", out)
    # ... said as the line of the user's own file, everywhere it is printed
    user_line = _planted_line("encoder_every_step", tmp_path)
    assert report["perf"]["pathologies"][0]["user_where"] == user_line != report["perf"]["pathologies"][0]["where"]
    assert f"at {user_line}" in state["reason"]
    md = (out / "report.md").read_text()
    assert "validated, with 1 performance pathology" in md and "runs in every decode step" in md
    png = out / "plots" / "profile" / "decode_profile.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plots/profile/decode_profile.png" in md

    res = verify_bundle(out, model, workdir=tmp_path / "verify")
    claim = next(c for c in res.claims if c.name == "decode profile")
    assert claim.verdict == "agree", res.lines()
    report["perf"]["pathologies"] = []  # a report that hides the pathology
    (out / "report.json").write_text(json.dumps(report))
    res = verify_bundle(out, model, workdir=tmp_path / "verify2")
    assert next(c for c in res.claims if c.name == "decode profile").verdict == "disagree", res.lines()

    strict = run_port({"request": {"model_path": str(model), "target": "cpu", "out_dir": str(tmp_path / "strict"),
                                   "strict_perf": True}}, "perf-port-strict")
    assert strict["status"] == "failed"
    assert strict["reason"].startswith("--strict-perf: greedy tokens match, but 1 performance pathology")
    assert f"at {user_line}" in strict["reason"]
