"""sandbox/bench/throughput.py: the in-sandbox benchmark measures what it says, reports bad configurations as
data, and runs the original as written under the cuda->cpu redirect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.bench.runner import run_bench
from sandbox.bench.throughput import _percentile
from sandbox.isolation.process import Limits

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ocr_mini"

TOY_MODEL = '''
import torch
import torch.nn as nn


class Toy(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.mix = nn.Linear(config["hidden_size"], config["hidden_size"])
        self.head = nn.Linear(config["hidden_size"], config["vocab_size"])

    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids
        for _ in range(max_new_tokens):
            h = torch.tanh(self.mix(self.emb(ids))).mean(dim=1)
            nxt = self.head(h).argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
        return ids[:, input_ids.shape[1]:]


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab_size"], (1, 6), generator=g)}
'''


@pytest.fixture()
def toy(tmp_path: Path) -> tuple[Path, dict]:
    d = tmp_path / "toy"
    d.mkdir()
    (d / "toy_model.py").write_text(TOY_MODEL)
    (d / "config.json").write_text('{"vocab_size": 32, "hidden_size": 16}')
    manifest = {"entry": {"class": "toy_model:Toy"}, "config": "config.json", "inputs": "toy_model:make_inputs",
                "run": {"method": "generate", "kwargs": {"max_new_tokens": 4}}}
    return d, manifest


def test_percentile_nearest_rank() -> None:
    assert _percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert _percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    assert _percentile([5.0], 50) == 5.0


def test_throughput_latency_and_waves(toy: tuple[Path, dict], tmp_path: Path) -> None:
    model, manifest = toy
    run = run_bench(workdir=tmp_path, model_dir=model, run_dir=tmp_path / "r", manifest=manifest,
                    configs=[{"id": "b2", "batch": 2, "threads": 1}], concurrencies=[1, 4], warmup=1, repeats=3,
                    limits=Limits(wall_s=120))
    assert run.ok, run.error()
    cfg = run.result["configs"][0]
    assert cfg["status"] == "ok" and cfg["threads_used"] == 1
    p1, p4 = cfg["points"]
    assert (p1["concurrency"], p1["waves"], p1["new_tokens"]) == (1, 1, 4)
    assert (p4["concurrency"], p4["waves"], p4["new_tokens"]) == (4, 2, 16)  # 4 requests in waves of 2
    for p in (p1, p4):
        assert len(p["tokens_per_s_runs"]) == 3 and p["tokens_per_s"] > 0
        assert 0 < p["latency_p50_s"] <= p["latency_p99_s"]
        assert p["spread"] >= 0
    assert len(cfg["tokens"][0]) == 4


def test_bad_configurations_are_reported_not_raised(toy: tuple[Path, dict], tmp_path: Path) -> None:
    model, manifest = toy
    good = run_bench(workdir=tmp_path, model_dir=model, run_dir=tmp_path / "g", manifest=manifest,
                     configs=[{"id": "ref"}], concurrencies=[1], warmup=0, repeats=1)
    ref = good.result["configs"][0]["tokens"]
    wrong_ref = [[(t + 1) % 32 for t in ref[0]]]
    configs: list[dict[str, Any]] = [{"id": "kv", "kv_cache": True}, {"id": "compile", "compile": "max-speed"},
               {"id": "dtype", "dtype": "int8"}, {"id": "ok", "batch": 1}]
    run = run_bench(workdir=tmp_path, model_dir=model, run_dir=tmp_path / "b", manifest=manifest, configs=configs,
                    concurrencies=[1], warmup=0, repeats=1, reference_tokens=wrong_ref)
    assert run.ok, run.error()
    by = {c["id"]: c for c in run.result["configs"]}
    assert by["kv"]["status"] == "infeasible" and "kv_cache" in by["kv"]["detail"]
    assert by["compile"]["status"] == "infeasible" and "max-speed" in by["compile"]["detail"]
    assert by["dtype"]["status"] == "infeasible"
    assert by["ok"]["status"] == "mismatch" and by["ok"]["tokens_match"] is False


@pytest.mark.slow
def test_original_as_written_runs_under_the_redirect(tmp_path: Path) -> None:
    """The baseline: ocr_mini exactly as written (CUDA-only) benchmarked on this CPU host."""
    manifest = yaml.safe_load((EXAMPLE / "npuport.yaml").read_text())
    run = run_bench(workdir=tmp_path, model_dir=EXAMPLE, run_dir=tmp_path / "base", manifest=manifest,
                    configs=[{"id": "baseline", "batch": 1}], device="cuda", redirect="cuda->cpu",
                    concurrencies=[1], warmup=0, repeats=1, limits=Limits(wall_s=300))
    assert run.ok, run.error()
    assert "flash_attn" in run.result["stubbed_modules"]
    cfg = run.result["configs"][0]
    assert cfg["status"] == "ok", cfg.get("detail")
    assert cfg["points"][0]["new_tokens"] == 8 and cfg["points"][0]["tokens_per_s"] > 0
