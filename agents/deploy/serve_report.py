"""The report section of the exercised deployment (deployment.json, written by agents/deploy/serving.py)."""

from __future__ import annotations

from typing import Any

from agents.request import request_of
from knowledge.settings import settings

IMPLEMENTATION = {
    "vllm-native": "vLLM's own class for the architecture (it ignores the patched modeling code)",
    "vllm-native-layout": "vLLM's own class for the weights' layout (it ignores the patched modeling code)",
    "transformers-backend": "vLLM's Transformers backend over the patched code (it runs what the port patched)",
    "none": "none: no vLLM path",
}


PENDING = "pending"
"""The deployment's status in a bundle written before its deployment phase ran (or finished)."""


def serving_requested(source: dict[str, Any]) -> bool:
    """The request's ``serve`` (of a state, a report or a request), else NPUPORT_SERVE."""
    value = request_of(source).serve
    return settings().serve if value is None else bool(value)


def deployment_summary(rec: dict[str, Any], cut: int | None = None) -> str:
    """One line: served (by what), tokens, the best throughput; or why not (its reason's first line, whole
    unless ``cut`` says how many characters of it to keep)."""
    if rec.get("status") == PENDING:
        return ("not run yet: the bundle is written first and the deployment check follows; if the port was "
                "stopped before it ended, `npuport deploy BUNDLE` runs it")
    if rec.get("status") != "served":
        why = str(rec.get("error") or "").strip().splitlines()[0][:cut] if rec.get("error") else ""
        status = str(rec.get("status"))
        return why if why.startswith(status) else f"{status}: {why}"  # the error may already say it
    rows = (rec.get("throughput") or {}).get("rows") or []
    top = rows[-1] if rows else {}
    eng = rec.get("engine_tuning") or {}
    tuned = (f"; engine tuned on this host: {eng.get('deployed')} serve.sh deployed ({eng.get('tuned_vs_untuned')}x "
             "the untuned)" if eng.get("deployed") else "")
    probe = " (probe)" if (rec.get("budget") or {}).get("plan") == "probe" else ""
    return (f"served by vLLM ({rec.get('implementation')}); tokens {'PASS' if rec['tokens']['ok'] else 'FAIL'}"
            + (f"; {top['output_tokens_per_s']} tok/s at concurrency {top['concurrency']}{probe} "
               f"({top.get('vs_one_at_a_time')}x Transformers one at a time)" if top else "") + tuned)


def _measured_on(counts: dict[str, Any]) -> str:
    """Which Transformers rates were timed on fewer requests than the workload has (the time budget)."""
    parts = [f"{'one at a time' if b == '1' else f'batched {b}'} on {c['measured']} of {c['planned']}"
             for b, c in counts.items() if c.get("measured") and c.get("planned") and c["measured"] < c["planned"]]
    return f" (timed on a prefix of the workload: {', '.join(parts)} requests)" if parts else ""


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


def _budget_lines(rec: dict[str, Any]) -> list[str]:
    """What the check's budget allowed, and what it cut (agents/deploy/check_plan.py)."""
    budget = rec.get("budget") or {}
    if not budget:
        return []
    lines = [f"- budget: the server's start up to {_ms(budget.get('start_timeout_s'))} s, then tokens and throughput "
             f"up to {_ms(budget.get('after_start_s'))} s"]
    if budget.get("cut"):
        lines.append(f"- cut by the budget: {budget['cut']}")
    if budget.get("cut_now"):
        lines.append(f"- cut on this run: {budget['cut_now']}")
    if budget.get("timed_out"):
        lines.append(f"- ran past its limit: {budget['timed_out']} (`npuport deploy BUNDLE` runs the check again)")
    return lines


def _without_status(error: str, status: str) -> str:
    """The error without a leading repeat of the status ("no vLLM path: no vLLM path ...")."""
    text = error.strip()
    return text[len(status):].lstrip(" :;") if text.lower().startswith(status.lower()) else text


def deployment_lines(rec: dict[str, Any] | None) -> list[str]:
    """The report's Deployment section: how it was served, the tokens through the server, the throughput and
    the engine's tuning."""
    if not rec:
        return ["## Deployment", "", "Not exercised (serving was off: `--serve` or NPUPORT_SERVE=1 runs it; "
                "`npuport deploy BUNDLE` runs it on this bundle): serve.sh was written and never started on this "
                "host.", ""]
    from agents.deploy.engine_tune import report_lines

    return (_how_served_lines(rec) + _token_lines(rec) + _throughput_lines(rec)
            + report_lines(rec.get("engine_tuning")) + [""])


def _how_served_lines(rec: dict[str, Any]) -> list[str]:
    """The heading, the engine and implementation that served, what was tried first, the server's error."""
    status = rec.get("status")
    if status == PENDING:
        return ["## Deployment: NOT RUN YET", "", "The bundle is written first; the deployment check (vLLM serving the "
                "port with serve.sh) follows it and adds deployment.json and this section. If the port was stopped "
                "before it ended, `npuport deploy BUNDLE` runs it.", ""]
    lines = ["## Deployment (exercised: vLLM served the port)" if status == "served"
             else f"## Deployment: {str(status).upper()}", ""]
    lines.append(f"- engine: {rec.get('host')}; served with the bundle's own serve.sh, in the sandbox "
                 f"({rec.get('isolation') or 'unknown isolation'}; server and client on its loopback only)")
    impl = rec.get("implementation")
    if impl:
        lines.append(f"- implementation that served: {IMPLEMENTATION.get(impl, impl)}"
                     + (f" ({rec['servable'].get('detail')})" if rec.get("servable") else ""))
    first = rec.get("first_attempt")
    if first:
        lines.append(f"- first tried: {IMPLEMENTATION.get(first['implementation'], first['implementation'])}, "
                     "which failed the model, so vLLM's Transformers backend was tried: "
                     f"{str(first['error'])[:600]}")
    if rec.get("backend_retry"):
        lines.append(f"- after that failure, vLLM's Transformers backend over the patched code: "
                     f"{rec['backend_retry']}")
    if rec.get("config_note") and (status == "served" or rec.get("tokens")):  # only about a model vLLM ran
        lines.append(f"- {rec['config_note']}")
    if (rec.get("servable") or {}).get("quantization"):
        lines.append(f"- {rec['servable']['quantization']}")
    if rec.get("host_args"):
        lines.append(f"- added on this host: `{' '.join(rec['host_args'])}`, environment "
                     f"`{' '.join(f'{k}={v}' for k, v in (rec.get('host_env') or {}).items())}`"
                     " (eager: graph compilation takes minutes on a small CPU host)")
    if rec.get("start_s") is not None:
        lines.append(f"- server ready after {rec['start_s']} s")
    lines += _budget_lines(rec)
    if rec.get("exercised"):
        lines.append(f"- serve.sh settings exercised here: {', '.join(rec['exercised'])}")
    if rec.get("not_exercised"):
        lines.append(f"- not exercised on this host (Ascend only): {'; '.join(rec['not_exercised'])}")
    if rec.get("error") and status == "no vLLM path":
        lines += ["",
                  f"No vLLM path: {_without_status(str(rec['error']), 'no vLLM path')}. Nothing was served, and "
                  "serve.sh stops with this reason instead of starting vLLM."]
    elif rec.get("error"):
        lines += ["", "The deployment failed; the server's own words:", "", "```", str(rec["error"])[-2500:], "```"]
    needs = (rec.get("servable") or {}).get("needs") if status == "no vLLM path" else None
    if needs:
        lines += ["", "What a vLLM model class would need: the layers "
                  + ", ".join(f"{k} x{v}" for k, v in needs["leaf_layers"].items())
                  + f"; the weights ({needs['weight_name_count']} names, layer index folded): "
                  + ", ".join(f"`{n}`" for n in needs["weight_names"][:20])]
    return lines


def _token_lines(rec: dict[str, Any]) -> list[str]:
    """The served tokens and top-k logprobs against Transformers' (agents/deploy/token_gate.py)."""
    tok = rec.get("tokens")
    if not tok:
        return []
    dtype = rec.get("dtype")
    lines = ["", "### Tokens through the server", "",
             f"{'PASS' if tok['ok'] else 'FAIL'}: {tok['verdict']} ({tok['mode']}; served in {dtype}).",
             "", f"| prompt | Transformers float32 | Transformers {dtype} | vLLM server |",
             "|---|---|---|---|"]
    low = tok.get(f"reference_{dtype}") or []
    for i, (s, f) in enumerate(zip(tok["served"], tok["reference_float32"], strict=False)):
        lines.append(f"| {i} | `{f}` | `{low[i] if i < len(low) else '-'}` | `{s}` |")
    lines.append(f"\nDecided by: {tok.get('decided_by') or 'exact tokens or the token-match rate'}. Token-match "
                 f"rate (up to the first divergence): served vs float32 {tok['match_rate_served_vs_fp32']:.0%}; "
                 f"Transformers {dtype} vs float32 {tok['match_rate_ref_dtype_vs_fp32']:.0%}.")
    lp = tok.get("logprobs")
    if lp:
        divergences = ("; divergences: " + ", ".join(
            f"prompt {d['prompt']} position {d['position']} (served {d['served']}, float32 "
            f"{d['float32']}, float32's gap {d['float32_logprob_gap']})" for d in lp["divergences"][:6])
            if lp.get("divergences") else "")
        lines.append(f"Top-k logprobs through the server against Transformers float32 (up to each row's first "
                     f"divergence): {lp['compared']} compared, largest difference {lp['max_abs_diff']:.3f} nats; "
                     f"tolerance {lp['tolerance']:.3f} nats (the reference's own float32-vs-{dtype} "
                     f"drift {lp['reference_drift']:.3f} nats, doubled, at least 0.05){divergences}.")
    return lines


def _throughput_lines(rec: dict[str, Any]) -> list[str]:
    """vLLM's output tokens per second at each concurrency beside Transformers' one at a time and batched."""
    tp = rec.get("throughput")
    if not (tp and tp.get("rows")):
        return []
    one = tp.get("transformers_one_at_a_time_tok_s")
    probe = (rec.get("budget") or {}).get("plan") == "probe"
    lines = ["", "### Throughput " + ("probe (the check's budget: `npuport bench BUNDLE` runs the full comparison)"
                                       if probe else "(one run, same requests: mixed prompt and output lengths)"), "",
             f"Transformers `generate`, one request at a time: {_ms(one)} output tok/s"
             + _measured_on(tp.get("transformers_requests") or {}) + ".", "",
             "| concurrency | vLLM output tok/s | median TTFT (ms) | median TPOT (ms) | Transformers batched "
             "tok/s | vLLM / one at a time | vLLM / batched |", "|---|---|---|---|---|---|---|"]
    for r in tp["rows"]:
        lines.append(f"| {r['concurrency']} | {r['output_tokens_per_s']} | {_ms(r['median_ttft_ms'])} | "
                     f"{_ms(r['median_tpot_ms'])} | {_ms(r.get('transformers_batched_tok_s'))} | "
                     f"{_ms(r.get('vs_one_at_a_time'))}x | {_ms(r.get('vs_batched'))}x |")
    lines.append("\nTransformers batched pads each batch to its longest prompt and decodes to its longest output "
                 "(what a caller of `generate` waits for); tokens counted are the ones each request asked for. "
                 f"Both sides in {rec.get('dtype')}, on this host's CPU. TTFT and TPOT are as the client received "
                 "the stream: when the API server lags the engine, vLLM merges a request's pending tokens into "
                 "one chunk, so a TPOT near 0 means the tokens arrived together (TTFT is then the request's "
                 "latency).")
    return lines
