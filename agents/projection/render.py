"""A projection for people: the CLI's text, the report's "Projected on <chip>" section (markdown)."""

from __future__ import annotations

from agents.projection.cost import ModelCost
from agents.projection.project import Projection


def count_text(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def _gib(x: float) -> str:
    return f"{x:.2f} GiB" if x >= 1 else f"{x * 1024:.1f} MiB"


def cost_lines(cost: ModelCost) -> list[str]:
    """The model of the model: each layer kind with its parameters, active parameters and KV cache."""
    lines = [f"model: {cost.source}",
             f"  {count_text(cost.params)} parameters, {count_text(cost.active_params)} read per token, "
             f"{cost.layers} decoder layers, KV cache {cost.kv_elems_per_token} elements per token"]
    for k in cost.kinds:
        extra = f", {k.experts} experts, {k.top_k} per token" if k.kind == "moe" else ""
        kv = f", KV {k.kv_elems_per_token // max(k.count, 1)} per token per layer" if k.kv_elems_per_token else ""
        lines.append(f"  - {k.kind} x{k.count}: {count_text(k.params)} parameters, {count_text(k.active_params)} "
                     f"active{extra}{kv} ({k.detail})")
    if cost.encoder:
        e = cost.encoder
        lines.append(f"  - encoder: {count_text(e.params)} parameters, {e.flops_per_image / 1e12:.2f} TFLOPs "
                     f"per image, {e.output_tokens} tokens to the language model per image ({e.detail})")
    return lines + [f"  note: {n}" for n in cost.notes]


def table_lines(p: Projection) -> list[str]:
    head = (f"{'concurrency':>11}  {'running':>7}  {'out tok/s':>10}  {'per card':>9}  {'TTFT ms':>9}  {'TPOT ms':>8}  "
            "bound")
    lines = [head]
    for r in p.rows:
        lines.append(f"{r.concurrency:>11}  {r.running:>7}  {r.output_tok_s:>10.1f}  {r.output_tok_s_per_card:>9.1f}  "
                     f"{r.ttft_ms:>9.1f}  {r.tpot_ms:>8.2f}  {r.bound}")
    return lines


def memory_lines(p: Projection) -> list[str]:
    m = p.memory
    lines = [f"weights {_gib(m.weights_gib_per_card)} per card; runtime {_gib(m.reserve_gib_per_card)}; KV cache "
             f"budget {_gib(m.kv_budget_gib_per_card)} per card; KV cache per request "
             f"{m.kv_per_request_mib:.1f} MiB per card ({p.input_len} in + {p.output_len} out"
             + (f" + {p.images} image(s)" if p.images else "") + " tokens)"]
    if m.fits:
        lines.append(f"largest concurrency that fits: {m.max_concurrency} (at this length)")
    else:
        lines.append(f"does not fit: {m.note}")
    return lines


def text(p: Projection, cost: ModelCost) -> str:
    title = (f"Projected on {p.chip}, {p.cards} card(s), {p.dtype}, {'graph mode' if p.graph_mode else 'eager'}: "
             f"{p.input_len} input / {p.output_len} output tokens" + (f", {p.images} image(s)" if p.images else ""))
    lines = [title, "", *table_lines(p), "", *memory_lines(p), "", *cost_lines(cost),
             f"engine efficiency: {p.efficiency}", f"host syncs / CPU fallbacks: {p.host_costs}"]
    lines += [f"note: {n}" for n in p.notes if n not in cost.notes]
    return "\n".join(lines)


def markdown(p: Projection, cost: ModelCost) -> list[str]:
    """The report's section: the table, the memory and where every figure comes from."""
    lines = [f"## Projected on {p.chip}", "",
             f"{p.cards} card(s), {p.dtype}, {'graph mode' if p.graph_mode else 'eager'}, {p.input_len} input / "
             f"{p.output_len} output tokens per request{f', {p.images} image(s)' if p.images else ''}; the full-size "
             "config (never the shrunk one). A projection, not a measurement: docs/deploy.md says how it is made "
             "and where it is known to be wrong.", "",
             "| concurrency | running | output tok/s | per card | TTFT ms | TPOT ms | bound |",
             "|---|---|---|---|---|---|---|"]
    for r in p.rows:
        lines.append(f"| {r.concurrency} | {r.running} | {r.output_tok_s:.1f} | {r.output_tok_s_per_card:.1f} | "
                     f"{r.ttft_ms:.1f} | {r.tpot_ms:.2f} | {r.bound} |")
    costs = [f"  {x.strip()}" if x.startswith("  - ") else f"- {x.strip()}" for x in cost_lines(cost)]
    lines += ["", *[f"- {x}" for x in memory_lines(p)], *costs,
              f"- engine efficiency: {p.efficiency}", f"- host syncs / CPU fallbacks: {p.host_costs}"]
    lines += [f"- note: {n}" for n in p.notes if n not in cost.notes]
    return [*lines, ""]


def report_section(report: dict[str, object]) -> list[str]:
    """report.md's "Projected on <chip>" section from report.json's ``projection``."""
    p = report.get("projection")
    if not isinstance(p, dict):
        return []
    if p.get("error"):
        return ["## Projected on the chip", "", f"- not projected: {p['error']}", ""]
    md = p.get("markdown")
    return [str(x) for x in md] if isinstance(md, list) else []
