"""Deployment parts of a bundle: serve.sh / set_env.sh from model facts, requirements, plots, run.py,
the vLLM serving loop's parsing, and verify (agree on a fresh bundle, disagree on tampered ones)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.deploy import plots, requirements, vllm, write_deploy_bundle
from agents.deploy.vllm_loop import parse_bench_output, serve_argv
from agents.tuning.space import model_facts

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ocr_mini"
PNG = b"\x89PNG\r\n\x1a\n"


def ocr_config() -> dict[str, Any]:
    return json.loads((EXAMPLE / "config.json").read_text())


def test_serve_settings_follow_the_model_facts() -> None:
    """Without serving docs (no knowledge base): the model's facts and the documented defaults, said so."""
    moe = vllm.plan_serve(model_facts(ocr_config(), has_custom_code=True), chip="910b")
    by = {s.name: s for s in moe}
    assert by["max-model-len"].value == 128  # the model's max_position_embeddings
    assert by["trust-remote-code"].value is True
    assert by["VLLM_WORKER_MULTIPROC_METHOD"].value == "spawn"
    assert by["multistream_overlap_shared_expert"].kind == "additional_config"
    assert by["PYTORCH_NPU_ALLOC_CONF"].kind == "env" and by["PYTORCH_NPU_ALLOC_CONF"].source == "documented default"
    assert by["gpu-memory-utilization"].citation.startswith("documented default")
    assert by["dtype"].value == "bfloat16"
    for s in moe:
        assert s.reason and s.citation and s.measured == (vllm.NPU_ONLY if vllm.ascend_only(s)
                                                          else "not measured on this host")
        assert s.source in ("derived", "documented default")

    dense = dict(ocr_config(), n_routed_experts=0)
    dense.pop("auto_map")
    plain = {s.name: s for s in vllm.plan_serve(model_facts(dense), chip="310p",
                                                tuned={"enforce_eager": True, "max_num_seqs": 16})}
    assert "trust-remote-code" not in plain and "VLLM_WORKER_MULTIPROC_METHOD" not in plain
    assert "multistream_overlap_shared_expert" not in plain
    assert plain["dtype"].value == "float16"  # no bf16 on 310P
    assert plain["enforce-eager"].value is True and plain["enforce-eager"].source == "tuned"
    assert plain["max-num-seqs"].value == 16


def test_serve_and_env_scripts_are_valid_bash(tmp_path: Path) -> None:
    settings = vllm.plan_serve(model_facts(ocr_config(), has_custom_code=True))
    serve = tmp_path / "serve.sh"
    serve.write_text(vllm.render_serve_sh(settings, "ocr_mini"))
    env = tmp_path / "set_env.sh"
    env.write_text(vllm.render_set_env_sh(settings))
    for f in (serve, env):
        r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    text = serve.read_text()
    assert "vllm serve" in text and "--max-model-len 128" in text and "--trust-remote-code" in text
    assert "--additional-config" in text and "multistream_overlap_shared_expert" in text
    assert "vllm-ascend-docs/additional_config.md" in text
    r = subprocess.run(["bash", "-c", f"source {env} && echo $VLLM_WORKER_MULTIPROC_METHOD $PYTORCH_NPU_ALLOC_CONF"],
                       capture_output=True, text=True)
    assert r.stdout.split() == ["spawn", "expandable_segments:True"]


def test_requirements_pin_torch_and_what_the_model_imports() -> None:
    req, con = requirements.render(EXAMPLE)
    assert "torch>=2.13.0,<2.14" in req.splitlines()
    assert "numpy" in req.splitlines() and "pyyaml" in req.splitlines()
    assert "flash_attn" not in req and "tokenization_ocr_mini" not in req  # CUDA-only lib, local module
    assert "torch_npu==2.13.0" in con.splitlines()
    assert any(line.startswith("numpy==") for line in con.splitlines())


def _fake_tuning() -> dict[str, Any]:
    pts = [{"concurrency": c, "tokens_per_s": 50.0 * c, "latency_p50_s": 0.1, "latency_p99_s": 0.2}
           for c in (1, 2, 4, 8)]
    base = [{"concurrency": c, "tokens_per_s": 5.0, "latency_p50_s": 1.0 * c, "latency_p99_s": 1.5 * c}
            for c in (1, 2, 4, 8)]
    trials = [{"id": f"trial-{i}", "params": {"batch": i}, "value": (None if i == 2 else 40.0 * i), "status": "ok"}
              for i in range(1, 6)]
    return {"status": "done", "best": {"batch": 8, "threads": 2}, "trials": trials,
            "baseline": {"points": base, "tokens_per_s": 5.0},
            "tuned": {"points": pts, "tokens_per_s": 400.0, "concurrency": 8, "target": "cpu"}}


def test_plots_are_pngs(tmp_path: Path) -> None:
    out = plots.write_plots(_fake_tuning(), tmp_path / "plots", "ocr_mini")
    assert set(out) == {"plot_throughput_vs_concurrency", "plot_baseline_vs_tuned", "plot_tuning_trace"}
    for p in out.values():
        data = Path(p).read_bytes()
        assert data[:8] == PNG and len(data) > 10_000
    assert plots.write_plots({"status": "skipped"}, tmp_path / "none", "m") == {}


def test_write_deploy_bundle_without_tuning(tmp_path: Path) -> None:
    patched = tmp_path / "bundle" / "patched"
    shutil.copytree(EXAMPLE, patched)
    state = {"request": {"model_path": str(EXAMPLE), "chip": "910b"}, "target": {"name": "cpu"},
             "entry": {"config": "config.json"}, "tuning": {"status": "skipped"}}
    files = write_deploy_bundle(state, tmp_path / "bundle")
    assert {"run_py", "model_inputs_py", "serve_sh", "set_env_sh", "requirements", "constraints",
            "deploy_json"} <= set(files)
    deploy = json.loads(Path(files["deploy_json"]).read_text())
    assert any(s["name"] == "VLLM_WORKER_MULTIPROC_METHOD" for s in deploy["serve_settings"])
    compile(Path(files["run_py"]).read_text(), "run.py", "exec")


def test_vllm_loop_parses_the_serving_benchmark() -> None:
    text = ("============ Serving Benchmark Result ============\nSuccessful requests: 128\n"
            "Output token throughput (tok/s):         1234.56\nMedian TTFT (ms):      81.2\n"
            "Median TPOT (ms):      12.5\n")
    res = parse_bench_output(text)
    assert (res.output_tokens_per_s, res.median_ttft_ms, res.median_tpot_ms) == (1234.56, 81.2, 12.5)
    assert parse_bench_output("server crashed").output_tokens_per_s is None
    argv = serve_argv(Path("/m"), {"max_model_len": 4096, "max_num_seqs": 32, "max_num_batched_tokens": 8192,
                                   "gpu_memory_utilization": 0.9, "enforce_eager": True}, 8011)
    assert argv[:3] == ["vllm", "serve", "/m"] and "--enforce-eager" in argv and "--compilation-config" not in argv


def test_vllm_loop_on_a_real_npu(tmp_path: Path) -> None:
    pytest.importorskip("torch_npu", reason="torch_npu is not importable: no Ascend NPU on this host")
    pytest.importorskip("vllm", reason="vllm (with vllm-ascend) is not installed")
    from agents.deploy.vllm_loop import measure

    out = measure(EXAMPLE, {"max_model_len": 128, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                            "gpu_memory_utilization": 0.5, "enforce_eager": True, "trust_remote_code": True},
                  {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, prompts=8, input_len=32, output_len=8)
    assert out.status in ("ok", "error")  # ocr_mini is not a vLLM architecture; the loop must report, not hang


# ---------------------------------------------------------------------------------------------
# End to end: a real port of ocr_mini on cpu through the graph, then verify.
# ---------------------------------------------------------------------------------------------


# The module's bundle is a tuned port built in the first test's setup, which pytest-timeout counts: on a
# loaded 2-core runner it took over the default 600 s (CI beside the zoo bench), alone ~130 s.
BUNDLE_TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import os

    home = tmp_path_factory.mktemp("home")
    out = tmp_path_factory.mktemp("bundle")
    old = {k: os.environ.get(k) for k in ("NPUPORT_HOME", "NPUPORT_TUNE_TRIALS", "NPUPORT_SERVE")}
    # vLLM serving the port (and verify re-serving it) is tests/test_engine_tuning.py's and test_serving.py's;
    # this bundle is for run.py and verify's tokens and numbers
    os.environ.update(NPUPORT_HOME=str(home), NPUPORT_TUNE_TRIALS="3", NPUPORT_SERVE="0")
    try:
        from graph.runner import run_port

        state = run_port({"request": {"model_path": str(EXAMPLE), "target": "cpu", "out_dir": str(out),
                                      "tune": True}}, "test-deploy-verify")
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert state["status"] == "validated", state.get("reason")
    assert state["tuning"]["status"] == "done", state["tuning"].get("detail")
    if not (out / "run.py").exists():  # the reporter does not call write_deploy_bundle yet
        write_deploy_bundle(state, out)
    return out


# run.py as on a deployment host: npuport (and torch_npu) not importable
WITHOUT_NPUPORT = ("import runpy, sys\n"
                   "for pkg in ('knowledge', 'sandbox', 'agents', 'api', 'graph', 'torch_npu'):\n"
                   "    sys.modules[pkg] = None  # importing it raises ImportError, as on a host without it\n"
                   "sys.argv = ['run.py', *sys.argv[1:]]\n"
                   "runpy.run_path('run.py', run_name='__main__')\n")


@pytest.mark.slow
@pytest.mark.timeout(BUNDLE_TIMEOUT_S)
def test_fresh_bundle_runs_and_verifies(bundle: Path) -> None:
    from agents.deploy import verify_bundle

    tuning = json.loads((bundle / "report.json").read_text())["tuning"]
    assert len(tuning["trials"]) >= 1 and tuning["tuned"]["tokens_per_s"] > 0
    # run.py and the inputs modules beside it need nothing of npuport (their fallback error base once had no
    # MRO and failed at import there); a target whose stack is missing is one line naming it
    r = subprocess.run([sys.executable, "-c", WITHOUT_NPUPORT, "--target", "cpu", "--repeats", "1"], cwd=bundle,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for target, need in (("ascend-sim", "needs npuport"), ("npu", "torch_npu")):
        missing = subprocess.run([sys.executable, "-c", WITHOUT_NPUPORT, "--target", target], cwd=bundle,
                                 capture_output=True, text=True, timeout=300)
        assert missing.returncode == 1 and "Traceback" not in missing.stderr, missing.stderr
        assert f"run.py: target {target} " in missing.stderr and need in missing.stderr, missing.stderr
    assert "request 0: tokens" in r.stdout and "tokens/s" in r.stdout
    report_tokens = json.loads((bundle / "report.json").read_text())["numerics"]["port_tokens"][0]
    assert str(report_tokens) in r.stdout  # run.py reproduces the validated tokens
    res = verify_bundle(bundle, EXAMPLE, tolerance=0.5)  # a shared 2-core host: wide tolerance
    verdicts = {c.name: c.verdict for c in res.claims}
    # The throughput verdict depends on what else the host runs (the fixture's figure and this one are
    # minutes apart on a shared 2-core runner): here only that it was re-measured; its tolerance logic has
    # its own tests, and bench/ judges the speed.
    # A host whose runs spread past what any comparison resolves says so ("unchecked"), never a verdict.
    throughput = next(c for c in res.claims if c.name == "throughput")
    assert throughput.verdict in ("agree", "disagree", "unchecked") and float(throughput.observed or 0) > 0, \
        res.lines()
    assert "tokens/s now" in throughput.detail
    assert ("x either way" in throughput.detail if throughput.verdict != "unchecked"
            else "not comparable on this host" in throughput.detail), throughput.detail
    verdicts.pop("throughput")
    assert verdicts == {"patch applies": "agree", "tokens match": "agree", "decode profile": "agree",
                        "deployment": "no claim"}, res.lines()  # not served (CI)


@pytest.mark.slow
@pytest.mark.timeout(BUNDLE_TIMEOUT_S)
def test_tampered_patch_disagrees(bundle: Path, tmp_path: Path) -> None:
    from agents.deploy import verify_bundle

    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    patch = (bad / "port.patch").read_text()
    (bad / "port.patch").write_text(patch.replace("npu", "gpu", 1) if "npu" in patch else patch + "garbage\n")
    lines = (bad / "port.patch").read_text().splitlines()
    # also flip one added line so the patch can no longer reproduce patched/
    idx = next(i for i, line in enumerate(lines) if line.startswith("+") and not line.startswith("+++"))
    lines[idx] = lines[idx] + "  # tampered"
    (bad / "port.patch").write_text("\n".join(lines) + "\n")
    res = verify_bundle(bad, EXAMPLE)
    assert res.claims[0].name == "patch applies" and res.claims[0].verdict == "disagree", res.lines()
    assert not res.agree


@pytest.mark.slow
@pytest.mark.timeout(BUNDLE_TIMEOUT_S)
def test_tampered_numbers_disagree(bundle: Path, tmp_path: Path) -> None:
    from agents.deploy import verify_bundle

    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    report = json.loads((bad / "report.json").read_text())
    # A claim a thousand times what the port measured: on CI the fixture's own figure, taken while other
    # tests load the 2 cores, has come out ~7x below verify's later re-measure, so a 100x claim (14x off the
    # re-measure) was within what a 143% spread and a changed host explain (at most 40x, beyond_any_noise);
    # the 10x case is tested without a benchmark in
    # test_verify_throughput_follows_a_host_that_changed_speed_but_not_a_wrong_ratio.
    report["tuning"]["tuned"]["tokens_per_s"] *= 1000
    report["numerics"]["port_tokens"][0][0] = (report["numerics"]["port_tokens"][0][0] + 1) % 80
    (bad / "report.json").write_text(json.dumps(report))
    res = verify_bundle(bad, EXAMPLE)
    verdicts = {c.name: c.verdict for c in res.claims}
    assert verdicts["patch applies"] == "agree"
    assert verdicts["tokens match"] == "disagree" and verdicts["throughput"] == "disagree", "\n".join(res.lines())
    assert not res.agree


def test_a_claim_no_noise_explains_is_refuted_even_on_a_host_too_noisy_to_confirm_it() -> None:
    from agents.deploy.verify import beyond_any_noise

    assert beyond_any_noise(66.0, 6600.0, noise=2.05)[0]  # 100x: wrong on any host (CI: spread 205%)
    assert beyond_any_noise(6600.0, 66.0, noise=2.05)[0]  # either way
    assert not beyond_any_noise(66.0, 200.0, noise=2.05)[0]  # 3x at 205% spread: neither confirmed nor refuted
    assert not beyond_any_noise(66.0, 1500.0, noise=9.0)[0]  # 23x: the cap keeps huge spreads from excusing more
    assert beyond_any_noise(66.0, 2100.0, noise=9.0)[0]  # ... than 30x
    assert "30x either way" in beyond_any_noise(1.0, 100.0, noise=5.0)[1]


def test_verify_compares_the_served_throughput_the_report_printed() -> None:
    """The deployment's tok/s (printed by the CLI and the report) is a claim verify checks, within 2x."""
    from agents.deploy.verify import _served_throughput

    def rec(*pairs: tuple[int, float]) -> dict:
        return {"throughput": {"rows": [{"concurrency": c, "output_tokens_per_s": v} for c, v in pairs]}}

    ok, why = _served_throughput(rec((1, 50.0), (32, 1000.0)), rec((1, 40.0), (32, 700.0)))
    assert ok and "concurrency 32" in why and "0.70x" in why
    ok, why = _served_throughput(rec((32, 1000.0)), rec((32, 300.0)))
    assert not ok and "tolerance 2.0x" in why
    ok, _ = _served_throughput(rec((32, 100.0)), rec((32, 350.0)))  # too fast is as suspect as too slow
    assert not ok
    assert _served_throughput({}, rec((1, 5.0)))[0]  # nothing was claimed: nothing to disagree with


def test_verify_reproduces_served_tokens_up_to_the_near_tie_the_report_parted_at() -> None:
    """Served tokens that parted from Transformers float32 at a near-tie are checked up to that tie: past it,
    greedy decoding follows whichever tied token won, and a second run of the bf16 engine flipped it (a
    DeepSeek-V3-style MoE: both runs passed the gate, verify disagreed on the tokens after the tie). Exact
    claims stay exact, and a rerun that parts earlier than the report did disagrees."""
    from agents.deploy.verify import same_served

    fp32 = [[5, 6, 7, 8, 9, 10]]
    tie = {"decided_by": "top-k logprobs", "served": [[5, 6, 7, 3, 4, 4]], "reference_float32": fp32}
    assert same_served(tie, {"served": [[5, 6, 7, 8, 9, 10]]})  # the tie went the other way this time
    assert same_served(tie, {"served": [[5, 6, 7, 2, 2, 2]]})
    assert not same_served(tie, {"served": [[5, 6, 1, 3, 4, 4]]})  # parts before the report's tie
    exact = {"decided_by": "exact tokens", "served": fp32, "reference_float32": fp32}
    assert same_served(exact, {"served": [[5, 6, 7, 8, 9, 10]]})
    assert not same_served(exact, {"served": [[5, 6, 7, 8, 9, 1]]})
    assert not same_served(tie, {"served": [[5, 6, 7, 3, 4, 4], [1]]})  # another number of rows


def test_verify_throughput_follows_a_host_that_changed_speed_but_not_a_wrong_ratio() -> None:
    """A tuned figure off the report's agrees when the untuned port, measured now, moved by the same factor
    (the CI host got 1.5x, then 6.5x, faster between the demo and its verify), and disagrees when the
    tuned/untuned ratio itself changed or the host would have moved beyond MAX_HOST_DRIFT."""
    from agents.deploy.verify import host_moved, within

    assert not within(721.2, 481.4, 0.30, 0.30)[0]
    ok, why = host_moved(721.2, 481.4, 160.0, 106.8, 0.30)
    assert ok and "host is faster" in why and "4.51x now vs 4.51x reported" in why, why
    ok, why = host_moved(721.2, 481.4, 106.0, 106.8, 0.30)  # the untuned port did not move: the claim is off
    assert not ok and "disagrees" in why
    ok, _ = host_moved(300.0, 481.4, 30.0, 106.8, 0.30)  # a slower host, but the ratio doubled: disagree
    assert not ok
    assert not host_moved(721.2, 481.4, 0.0, 106.8, 0.30)[0]
    ok, why = host_moved(426.1, 64.7, 112.9, 17.4, 0.35)  # CI: a demo ported at load ~10, verified when quieter
    assert ok and "6.49x" in why and "agrees" in why, why
    assert not host_moved(481.4, 9628.0, 106.8, 2136.0, 0.30)[0]  # every figure 20x too high is no faster host
    # a tuned figure claimed 10x what was measured, even at the widest tolerance the runs' spread allows
    assert not host_moved(721.2, 4814.0, 160.0, 106.8, 1.0)[0]


def test_a_benchmark_whose_runs_spread_past_2x_is_taken_again_and_the_steadiest_kept() -> None:
    from agents.deploy.verify import steadiest

    asked: list[int] = []

    def again(n: int) -> dict[str, float]:
        asked.append(n)
        return {"tokens_per_s": 1800.0, "spread": 0.2} if n == 3 else {"tokens_per_s": 40.0, "spread": 2.5}

    point, tries = steadiest({"tokens_per_s": 31.4, "spread": 3.1}, again)  # a burst of the host's load
    assert (point, tries, asked) == ({"tokens_per_s": 1800.0, "spread": 0.2}, 3, [2, 3])
    asked.clear()
    steady = {"tokens_per_s": 1843.1, "spread": 0.22}
    assert steadiest(steady, again) == (steady, 1) and asked == []  # a steady benchmark is taken once
    assert steadiest({"tokens_per_s": 30.0, "spread": 3.0}, lambda n: None, tries=2)[1] == 2  # bounded
