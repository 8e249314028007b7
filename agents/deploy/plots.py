"""PNG plots for the report (matplotlib, Agg backend): throughput vs concurrency, baseline vs tuned,
and the tuning trace. Each has a title, labelled axes with units, and a legend where it helps."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_vs_concurrency(tuning: dict[str, Any], path: Path, model: str) -> Path | None:
    tuned = (tuning.get("tuned") or {}).get("points") or []
    base = (tuning.get("baseline") or {}).get("points") or []
    if not tuned and not base:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for pts, label, marker in ((tuned, f"deployed port ({_cfg(tuning.get('best'))})", "o"),
                               (base, "original as written (eager, batch 1)", "s")):
        measured = [p for p in pts if p.get("tokens_per_s") is not None]
        if measured:
            xs = [p["concurrency"] for p in measured]
            # Only measured concurrencies are drawn (markers, no line between them): nothing is interpolated.
            label += f"; measured at {', '.join(map(str, xs))}"
            ax.plot(xs, [p["tokens_per_s"] for p in measured], marker=marker, linestyle="--", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("throughput (new tokens/s, log scale)")
    ax.set_title(f"{model}: throughput vs concurrency ({(tuning.get('tuned') or {}).get('target', '?')})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _cfg(best: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (best or {}).items() if v is not None) or "default"


def baseline_vs_tuned(tuning: dict[str, Any], path: Path, model: str) -> Path | None:
    """Bars of the original, the untuned and the tuned port at the tuning concurrency; a value that was
    not measured is written as "not measured" on an empty slot, never drawn as 0."""
    tuned = tuning.get("tuned") or {}
    if not tuned:
        return None
    base = tuning.get("baseline") or {}
    search = tuned.get("search_best") or {"config": tuning.get("best"), "tokens_per_s": tuned.get("tokens_per_s")}
    bars_data = [("original as written\n(eager, batch 1)", base.get("tokens_per_s"), "#999999"),
                 ("untuned port\n(batch 1)", (tuned.get("untuned") or {}).get("tokens_per_s"), "#9ecae1"),
                 (f"tuned port\n({_cfg(search.get('config'))})", search.get("tokens_per_s"), "#2b7bba")]
    if all(v is None for _, v, _ in bars_data):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    top = max(v for _, v, _ in bars_data if v is not None)
    for i, (_label, v, color) in enumerate(bars_data):
        if v is None:
            ax.bar(i, 0, color=color)
            ax.annotate("not measured", (i, top * 0.02), ha="center", va="bottom", fontsize=9, color="#aa0000")
        else:
            ax.bar(i, v, color=color)
            ax.annotate(f"{v:.1f}", (i, v), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(bars_data)), [b[0] for b in bars_data], fontsize=8)
    ax.set_ylabel("throughput (new tokens/s)")
    speed, vs = tuned.get("speedup"), tuned.get("vs_original")
    verdict = ("original not measured" if speed is None else
               f"port SLOWER than the original ({speed:.2f}x)" if vs == "slower" else
               f"{speed:.2f}x the original, not comparable on this host (spread {float(tuned.get('spread') or 0):.0%})"
               if vs == "not comparable" else f"{speed:.2f}x the original")
    if tuned.get("chosen") == "untuned":
        verdict += "; untuned deployed" if tuned.get("tuned_vs_untuned") == "not comparable" else \
            "; tuned slower than untuned: untuned deployed"
    ax.set_title(f"{model} at concurrency {tuned.get('concurrency', '?')}: {verdict}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def tuning_trace(tuning: dict[str, Any], path: Path, model: str) -> Path | None:
    trials = tuning.get("trials") or []
    if not trials:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ok = [(i + 1, t["value"]) for i, t in enumerate(trials) if t.get("value")]
    bad = [i + 1 for i, t in enumerate(trials) if not t.get("value")]
    if ok:
        ax.scatter([x for x, _ in ok], [v for _, v in ok], label="trial (median of repeats)", zorder=3)
        best, run = [], 0.0
        for i, t in enumerate(trials):
            run = max(run, t.get("value") or 0.0)
            best.append((i + 1, run))
        ax.step([x for x, _ in best], [v for _, v in best], where="post", label="best so far", color="#d62728")
    if bad:
        ax.scatter(bad, [0] * len(bad), marker="x", color="#555555", label="failed / infeasible when run", zorder=3)
    ax.set_xlabel("trial number")
    ax.set_ylabel("throughput (new tokens/s)")
    ax.set_title(f"{model}: tuning trace ({len(trials)} trials)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_plots(tuning: dict[str, Any], plots_dir: Path, model: str) -> dict[str, str]:
    plots_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, fn in (("throughput_vs_concurrency", throughput_vs_concurrency), ("baseline_vs_tuned", baseline_vs_tuned),
                     ("tuning_trace", tuning_trace)):
        p = fn(tuning, plots_dir / f"{name}.png", model)
        if p is not None:
            out[f"plot_{name}"] = str(p)
    return out


def decode_profile(perf: dict[str, Any] | None, path: Path, model: str) -> Path | None:
    """Per-step time and input length, original vs port, with the port's syncs and fallbacks per step
    (agents/validation/perf_evidence.py rows)."""
    rows = (perf or {}).get("rows") or []
    if not rows:
        return None
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6.5), dpi=110, sharex=True)
    steps = [r["step"] for r in rows]
    for key, label, marker in (("ref_ms", "original (CPU, float32)", "s"), ("ms", "port (target)", "o")):
        if any(r.get(key) is not None for r in rows):
            ax1.plot(steps, [r.get(key) for r in rows], marker=marker, label=label)
    ax1.set_ylabel("step time (ms)")
    n = len((perf or {}).get("pathologies") or [])
    ax1.set_title(f"{model}: decode profile per step ({n} performance patholog{'y' if n == 1 else 'ies'})")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    for key, label, marker in (("ref_input_len", "original: positions per step", "s"),
                               ("input_len", "port: positions per step", "o")):
        if any(r.get(key) is not None for r in rows):
            ax2.plot(steps, [r.get(key) for r in rows], marker=marker, label=label)
    ax2.bar([s - 0.2 for s in steps], [r.get("syncs") or 0 for r in rows], width=0.4, alpha=0.5,
            label="port: host syncs in the step loop")
    ax2.bar([s + 0.2 for s in steps], [r.get("fallbacks") or 0 for r in rows], width=0.4, alpha=0.5,
            label="port: CPU fallbacks in the step loop")
    ax2.set_xlabel("step (0 = prefill, then one per new token)")
    ax2.set_ylabel("count per step")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
