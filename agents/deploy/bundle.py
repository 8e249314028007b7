"""The deployment part of a bundle: run.py, serve.sh, set_env.sh, requirements.txt, constraints.txt,
deploy.json (the serve settings with reasons and citations) and plots/*.png. The reporter calls
:func:`write_deploy_bundle` after it has written port.patch and patched/."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from agents.deploy import plots, requirements, runscript, serve, serve_report, stack, vllm
from agents.request import request_of
from agents.runs import RUN_CONFIG_NAME, run_config_of
from agents.state import capabilities_of, entry_of, environment_of, tuning_of, workdir_if_set
from agents.tuning.space import model_facts
from knowledge.untrusted import one_line, read_model_config


def _model_dir(state: dict[str, Any], out_dir: Path) -> Path | None:
    workdir = workdir_if_set(state)
    for cand in (out_dir / "patched", workdir / "model" if workdir else None):
        if cand is not None and cand.is_dir():
            return cand
    return None


def serve_plan(state: dict[str, Any], model_dir: Path | None, search: serve.Search | None = None,
               engine: dict[str, Any] | None = None) -> tuple[list[vllm.ServeSetting], serve.ServePlan]:
    """The serve settings: the model's class from its config and code, the vllm-ascend docs the knowledge
    base holds for that class (``search``; default: the KB, when one is built), npuport's derived values,
    what the real-NPU loop measured, and the engine configuration the engine tuner measured on this host
    (``engine``, agents/deploy/engine_tune.py)."""
    manifest = entry_of(state)
    # read outside the sandbox: from inside the model's folder only, typed where it is used (model_facts)
    config = read_model_config(model_dir, manifest) if model_dir is not None else {}
    facts = model_facts(config, has_custom_code=bool(model_dir and any(model_dir.glob("*.py"))))
    req = request_of(state)
    docs = serve.plan_from_docs(serve.model_class(config, model_dir),
                                search if search is not None else serve.default_search(), req.chip)
    serving = tuning_of(state).serving  # from the real-NPU loop, when it ran
    settings = vllm.plan_serve(facts, chip=req.chip, tuned=serving.get("best"),
                               measured=serving.get("measured_on"), docs=docs, engine=engine)
    from agents.deploy.chip_sizing import size_for_chip  # sized for the chip by the projection (issue 44)

    return size_for_chip(settings, state, model_dir), docs


def serve_settings(state: dict[str, Any], model_dir: Path | None) -> list[vllm.ServeSetting]:
    return serve_plan(state, model_dir)[0]


def _write(path: Path, text: str, executable: bool = False) -> str:
    path.write_text(text)
    if executable:
        os.chmod(path, 0o755)
    return str(path)


def write_deploy_bundle(state: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Write the deployment files into ``out_dir``; returns {name: path} of what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tuning = tuning_of(state)
    target = capabilities_of(state).name
    model_dir = _model_dir(state, out_dir)
    req = request_of(state)
    name = Path(req.model_path or "model").name
    files: dict[str, str] = {}
    manifest = entry_of(state)
    files["run_py"] = _write(out_dir / "run.py", runscript.render_run_py(tuning.best, target, manifest,
                                                                         req.model_dump()), True)
    for fname, text in runscript.model_inputs_sources().items():  # model_inputs.py and the modules it imports
        files[fname.replace(".", "_")] = _write(out_dir / fname, text)
    # The exact small config the port was validated with (constructor-fitted, sandbox/harness/shrink_fit.py):
    # run.py, verify and the deployment use it as it is, never a config derived again.
    if req.shrink and (small := run_config_of(state)) is not None:
        files["run_config"] = _write(out_dir / RUN_CONFIG_NAME, json.dumps(small, indent=1))
    write_serve = serve_writer(state, out_dir, files)
    write_serve()
    if model_dir is not None:
        python = environment_of(state).python  # the layered env the runs used, if any
        req_txt, con_txt = requirements.render(model_dir, python if python and Path(python).exists() else None)
        files["requirements"] = _write(out_dir / "requirements.txt", req_txt)
        files["constraints"] = _write(out_dir / "constraints.txt", con_txt)
    files.update(plots.write_plots(tuning.model_dump(mode="json"), out_dir / "plots", name))
    method = (manifest.get("run") or {}).get("method")
    if serve_report.serving_requested(state) and workdir_if_set(state) and method not in (None, "generate"):
        files["deployment_json"] = _write(out_dir / "deployment.json", json.dumps(
            {"status": "not served", "error": "the model has no generate (validated on its forward outputs): vLLM's "
                                              "generation serving and its token check do not apply; serve.sh is "
                                              "written, not exercised"}, indent=1))
    # Serving it (the deployment phase, agents/report/deployment.py) comes after the bundle is written.
    return files


def serve_writer(state: dict[str, Any], out_dir: Path, files: dict[str, str] | None = None) -> Any:
    """A function that (re)writes serve.sh, set_env.sh and deploy.json, with an engine configuration measured on
    this host when given one (the engine tuner's); ``files`` records what it wrote."""
    files = files if files is not None else {}
    req = request_of(state)
    name = Path(req.model_path or "model").name
    tuning = tuning_of(state)
    target = capabilities_of(state).name
    model_dir = _model_dir(state, out_dir)
    src = req.model_path
    from agents.environment.compat import load_compat

    npu_like = capabilities_of(state).npu_like
    chosen_stack = stack.choose_stack(load_compat(), stack.default_search(), req.torch_npu if npu_like else None)

    def write_serve(engine: dict[str, Any] | None = None) -> None:
        """serve.sh, set_env.sh and deploy.json; ``engine``: the engine configuration measured on this host."""
        settings, docs = serve_plan(state, model_dir, engine=engine)
        script = vllm.render_serve_sh(settings, name, str(Path(src).resolve()) if src else None)
        if chosen_stack.get("chosen"):
            head, _, rest = script.partition("\n")
            note = vllm.comment("Serving stack (one tuple, agents/deploy/stack.py): " + chosen_stack["note"][:300])
            script = f"{head}\n{note}\n{rest}"
        files["serve_sh"] = _write(out_dir / "serve.sh", script, True)
        files["set_env_sh"] = _write(out_dir / "set_env.sh", vllm.render_set_env_sh(settings), True)
        files["deploy_json"] = _write(out_dir / "deploy.json", json.dumps(
            {"serve_settings": [s.model_dump() for s in settings], "tuned": tuning.best,
             "target": target, "model_class": docs.model.model_dump(), "serving_docs": docs.docs,
             "serving_note": docs.note, "serving_stack": chosen_stack, "engine": engine}, indent=1))

    return write_serve


def mark_serve_sh(out_dir: Path, record: dict[str, Any]) -> None:
    """serve.sh says itself whether it was started and what came of it (never an untested script unmarked); a
    model with no vLLM path gets the guard that stops it with the reason."""
    serve_sh = out_dir / "serve.sh"
    head, _, rest = serve_sh.read_text().partition("\n")
    if rest.startswith("# Started by npuport") or rest.startswith("# Checked (not started) by npuport"):
        rest = rest.partition("\n")[2]  # a rerun replaces the earlier note
    verb = "Started" if record.get("status") == "served" or record.get("throughput") else "Checked (not started)"
    note = vllm.comment(f"{verb} by npuport on this host ({record.get('host')}): "
                        f"{serve_report.deployment_summary(record, 300)}"[:400] + " (deployment.json)")
    if record.get("status") == "no vLLM path" and "exit 3\n" not in rest:
        rest = no_path_guard(rest, str(record.get("error") or ""))
    _write(serve_sh, f"{head}\n{note}\n{rest}", True)


def no_path_guard(script: str, reason: str) -> str:
    """serve.sh of a model vLLM has no path for: it stops with the reason before anything starts (the vLLM
    command stays below it, for whoever adds a model class)."""
    why = shlex.quote(f"serve.sh: no vLLM path for this model: {one_line(reason, 300)}. "
                      "vLLM has no class for it and cannot run its code (report.md, Deployment, lists what a vLLM "
                      "model class would need); the command below is what would serve it with one.")
    return script.replace("set -euo pipefail\n", f"set -euo pipefail\necho {why} >&2\nexit 3\n", 1)


NOT_MEASURED = "not measured"


def _tps(point: dict[str, Any] | None) -> str:
    v = (point or {}).get("tokens_per_s")
    return NOT_MEASURED if v is None else f"{v:.1f}"


def benchmark_lines(tuning: dict[str, Any]) -> list[str]:
    """The benchmark table: new tokens/s of the original, the untuned and the deployed port per
    concurrency; a point that was not measured says so (never 0.0)."""
    from agents.tuning.port import performance_sentence

    base, tuned = tuning.get("baseline") or {}, tuning.get("tuned") or {}
    if not tuned.get("points") and not base.get("points"):  # nothing benchmarked: no empty table
        return [f"No benchmark: {tuning.get('detail') or 'tuning not requested'}", ""]
    deployed = {p["concurrency"]: p for p in tuned.get("points") or []}
    search = {p["concurrency"]: p for p in (tuned.get("search_best") or {}).get("points") or []}
    bmap = {p["concurrency"]: p for p in base.get("points") or []}
    conc = sorted(set(deployed) | set(search) | set(bmap))
    untuned = tuned.get("untuned") or {}
    lines = ["Throughput counts new tokens only (generated minus prompt), measured the same way for the original "
             "and the port.", "",
             "| concurrency | original tokens/s | untuned port tokens/s | tuned port tokens/s | deployed p50 / p99 "
             "latency (s) |", "|---|---|---|---|---|"]
    for c in conc:
        d = deployed.get(c) or {}
        lat = (f"{d['latency_p50_s']:.3f} / {d['latency_p99_s']:.3f}" if d.get("latency_p50_s") is not None
               else NOT_MEASURED)
        un = {"tokens_per_s": untuned.get("tokens_per_s")} if c == tuned.get("concurrency") else None
        lines.append(f"| {c} | {_tps(bmap.get(c))} | {_tps(un)} | {_tps(search.get(c) or deployed.get(c))} | {lat} |")
    lines += ["", f"Measured on {tuned.get('measured_on', 'this host')}: {performance_sentence(tuned)}. "
              f"Deployed configuration: `{tuning.get('best')}`.", ""]
    effects = tuned.get("knob_effects") or {}
    if effects:
        lines += ["Knobs searched and what they did to the executed run (sandbox/bench/throughput.py records it):", ""]
        lines += [f"- {k}: {v}" for k, v in effects.items()] + [""]
    return lines


def deploy_markdown(report: dict[str, Any], out_dir: Path) -> str:
    """A report section (from report.json): benchmark numbers and the serve settings, each with reason and
    citation."""
    tuning = report.get("tuning") or {}
    deployed = out_dir / "deployment.json"
    lines = serve_report.deployment_lines(json.loads(deployed.read_text()) if deployed.is_file()
                                          else report.get("deployment"))
    lines += ["## Benchmark", ""] + benchmark_lines(tuning)
    if tuning.get("tuned") and (out_dir / "plots").is_dir():
        lines += [f"![{p.stem}](plots/{p.name})" for p in sorted((out_dir / "plots").glob("*.png"))] + [""]
    deploy = out_dir / "deploy.json"
    if deploy.exists():
        data = json.loads(deploy.read_text())
        mc = data.get("model_class") or {}
        lines += ["## Serving on vllm-ascend (serve.sh, set_env.sh)", "",
                  "- model class: "
                  + (", ".join(f"{k.replace('_', ' ')} ({v})" for k, v in (mc.get("why") or {}).items())
                                       or "text-only, no remote code"),
                  f"- {data.get('serving_note') or 'no serving docs consulted'}",
                  "- serve.sh serves an overlay folder: the original model's files (weights, tokenizer) linked, the "
                  "ported code of patched/ linked over them; the original folder is not written", "",
                  "| setting | value | reason | citation | source | measured |", "|---|---|---|---|---|---|"]
        for s in data["serve_settings"]:
            value = json.dumps(s["value"]) if isinstance(s["value"], dict) else s["value"]
            lines.append(f"| {s['name']} | `{value}` | {s['reason']} | {s['citation']} | {s.get('source', '')} | "
                         f"{s['measured']} |")
        lines.append("")
        lines += stack.stack_lines(data.get("serving_stack"))
    return "\n".join(lines)
