"""The deployment part of a bundle: run.py, serve.sh, set_env.sh, requirements.txt, constraints.txt,
deploy.json (the serve settings with reasons and citations) and plots/*.png. The reporter calls
:func:`write_deploy_bundle` after it has written port.patch and patched/."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agents.deploy import plots, requirements, runscript, vllm
from agents.tuning.space import model_facts


def _model_dir(state: dict[str, Any], out_dir: Path) -> Path | None:
    for cand in (out_dir / "patched", Path(state["workdir"]) / "model" if state.get("workdir") else None):
        if cand is not None and cand.is_dir():
            return cand
    return None


def serve_settings(state: dict[str, Any], model_dir: Path | None) -> list[vllm.ServeSetting]:
    manifest = state.get("entry") or {}
    config: dict[str, Any] = {}
    if model_dir is not None:
        cfg_path = model_dir / manifest.get("config", "config.json")
        if cfg_path.exists():
            config = json.loads(cfg_path.read_text())
    facts = model_facts(config, has_custom_code=bool(model_dir and any(model_dir.glob("*.py"))))
    req = state.get("request") or {}
    serving = (state.get("tuning") or {}).get("serving") or {}  # from the real-NPU loop, when it ran
    return vllm.plan_serve(facts, chip=req.get("chip", "910b"), tuned=serving.get("best"),
                           measured=serving.get("measured_on"))


def _write(path: Path, text: str, executable: bool = False) -> str:
    path.write_text(text)
    if executable:
        os.chmod(path, 0o755)
    return str(path)


def write_deploy_bundle(state: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Write the deployment files into ``out_dir``; returns {name: path} of what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tuning = state.get("tuning") or {}
    target = (state.get("target") or {}).get("name", "cpu")
    model_dir = _model_dir(state, out_dir)
    name = Path((state.get("request") or {}).get("model_path") or "model").name
    files: dict[str, str] = {}
    manifest = state.get("entry") or {}
    files["run_py"] = _write(out_dir / "run.py", runscript.render_run_py(tuning.get("best") or {}, target, manifest),
                             True)
    if (state.get("request") or {}).get("shrink") and model_dir is not None:
        # The exact small config the port was validated with; run.py uses it by default.
        from sandbox.shrink import shrink_config

        config_file = model_dir / str(manifest.get("config") or "config.json")
        if config_file.is_file():
            small, _ = shrink_config(json.loads(config_file.read_text()), manifest.get("shrink") or {}, model_dir)
            files["run_config"] = _write(out_dir / "run_config.json", json.dumps(small, indent=1))
    settings = serve_settings(state, model_dir)
    files["serve_sh"] = _write(out_dir / "serve.sh", vllm.render_serve_sh(settings, name), True)
    files["set_env_sh"] = _write(out_dir / "set_env.sh", vllm.render_set_env_sh(settings), True)
    files["deploy_json"] = _write(out_dir / "deploy.json", json.dumps(
        {"serve_settings": [s.model_dump() for s in settings], "tuned": tuning.get("best") or {},
         "target": target}, indent=1))
    if model_dir is not None:
        python = (state.get("environment") or {}).get("python")  # the layered env the runs used, if any
        req_txt, con_txt = requirements.render(model_dir, python if python and Path(python).exists() else None)
        files["requirements"] = _write(out_dir / "requirements.txt", req_txt)
        files["constraints"] = _write(out_dir / "constraints.txt", con_txt)
    files.update(plots.write_plots(tuning, out_dir / "plots", name))
    return files


def deploy_markdown(state: dict[str, Any], out_dir: Path) -> str:
    """A report section: benchmark numbers and the serve settings, each with reason and citation."""
    tuning = state.get("tuning") or {}
    lines = ["## Benchmark", ""]
    base, tuned = tuning.get("baseline") or {}, tuning.get("tuned") or {}
    if tuned.get("points"):
        lines += ["| concurrency | original tokens/s | tuned tokens/s | tuned p50 / p99 latency (s) |", "|---|---|---|---|"]
        bmap = {p["concurrency"]: p for p in base.get("points") or []}
        for p in tuned["points"]:
            b = bmap.get(p["concurrency"], {})
            lines.append(f"| {p['concurrency']} | {b.get('tokens_per_s', 0):.1f} | {p['tokens_per_s']:.1f} | "
                         f"{p['latency_p50_s']:.3f} / {p['latency_p99_s']:.3f} |")
        lines += ["", f"Measured on {tuned.get('measured_on', 'this host')}; speedup at concurrency "
                  f"{tuned.get('concurrency')}: {tuned.get('speedup') or 0:.1f}x. Tuned: `{tuning.get('best')}`.", ""]
        if (out_dir / "plots").is_dir():
            lines += [f"![{p.stem}](plots/{p.name})" for p in sorted((out_dir / "plots").glob("*.png"))] + [""]
    else:
        lines += [f"No benchmark: {tuning.get('detail', 'tuning not requested')}", ""]
    deploy = out_dir / "deploy.json"
    if deploy.exists():
        lines += ["## Serving on vllm-ascend (serve.sh, set_env.sh)", "",
                  "| setting | value | reason | citation | measured |", "|---|---|---|---|---|"]
        for s in json.loads(deploy.read_text())["serve_settings"]:
            value = json.dumps(s["value"]) if isinstance(s["value"], dict) else s["value"]
            lines.append(f"| {s['name']} | `{value}` | {s['reason']} | {s['citation']} | {s['measured']} |")
        lines.append("")
    return "\n".join(lines)
