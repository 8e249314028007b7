"""The zoo bench: ports every public remote-code release in the zoo (../shared/data/zoo: code and
configs, no weights) through the batch mode (`npuport batch`), with --shrink and the rule policy (no
LLM), on ascend-sim and on cpu. One row per release: status, sandbox runs, seconds, the first line of
the model's code the port reached, and the failure class; then the median and the slowest port time,
and last ``zoo: validated X/N ascend-sim, Y/N cpu``. Exits 1 below 90 % validated on a target run.

    python bench/zoo.py [ZOO_DIR] [--only name,name] [--target ascend-sim|cpu] [--workers 2]

The zoo is read where it lies (never copied into the project); each run is a fresh batch (its name
carries the start time), so nothing is skipped as already finished."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ZOO = ROOT.parent / "shared" / "data" / "zoo"
GOAL = 0.90
TARGETS = ("ascend-sim", "cpu")

# The classes of failure, matched on the port's reason (first match wins). A failure no class
# names is the model's own (its exception type is shown).
CLASSES: tuple[tuple[str, str], ...] = (
    ("npuport bug", r"internal error|Traceback \(most recent call last\)"),
    ("timeout", r"timed out"),
    ("2 dependencies: companion build", r"torchvision::|torchaudio::|operator .* does not exist"),
    ("2 dependencies: env build", r"layered environment|EnvBuildError|could not install|pip exit"),
    ("2 dependencies: missing package", r"No module named|ModuleNotFoundError|is required for|requires the"),
    ("1 era: version coupling", r"has no attribute '(generate|max_length|forced_bos_token_id|pad_token_id|"
                                r"bos_token_id|eos_token_id|get_head_mask|_tied_weights_keys|tie_encoder_decoder|"
                                r"use_return_dict|output_attentions|all_tied_weights_keys|"
                                r"_supports_sdpa|return_dict)'|name '(List|Optional|Tuple|Dict)' is not defined|"
                                r"cannot import name|KeyError: 'type'|rope_scaling"),
    ("4 reference not deterministic", r"not deterministic"),
    ("3 shrink", r"num_heads=0|divisible|shrink"),
    ("5 npuport rewrite", r"changed nothing|'NoneType' object is not subscriptable|flash"),
    ("validation: tokens differ", r"tokens differ|agree"),
    ("6 quantized checkpoint", r"bitsandbytes|quantiz|GPTQ|custom_autotune|arg_names"),
    ("harness: encoder without generate", r"not compatible with `\.generate\(\)`|language model head"),
    ("3 shrink (shape mismatch)", r"shape mismatch|must match the size|is invalid for input of size"),
)


def failure_class(reason: str) -> str:
    for name, pattern in CLASSES:
        if re.search(pattern, reason):
            return name
    m = re.search(r"because (\w+(?:Error|Exception))", reason)
    return f"model: {m.group(1)}" if m else "other"


def manifest_for(zoo: Path, names: list[str], target: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": f"zoo-{target}-{time.strftime('%Y%m%dT%H%M%S')}",
        "defaults": {"target": target, "shrink": True, "policy": "rule", "threads": args.threads,
                     "timeout_s": args.port_timeout, "memory_mb": 4096,
                     "budget": {"max_runs": args.max_runs, "max_wall_s": args.port_timeout,
                                "run_timeout_s": args.run_timeout}},
        "models": [{"path": str(zoo / n), "name": n} for n in names],
    }


def releases(zoo: Path, only: str) -> list[str]:
    found = sorted(p.name for p in zoo.iterdir() if p.is_dir() and (p / "config.json").is_file())
    if not only:
        return found
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in found]
    if unknown:
        sys.exit(f"not in {zoo}: {', '.join(unknown)}")
    return wanted


def first_model_line(report: dict[str, Any]) -> str:
    """The model file:line the port's last failure reached (its diagnosis), or '' when it reached none."""
    for d in reversed(report.get("diagnoses") or []):
        if d.get("file") and d.get("line"):
            return f"{d['file']}:{d['line']}"
    failure = report.get("failure") or {}
    if isinstance(failure, dict) and failure.get("file"):
        return f"{failure['file']}:{failure.get('line', '?')}"
    return ""


def env_used(report: dict[str, Any]) -> str:
    env = report.get("environment") or {}
    stack = (env.get("resolution") or {}).get("stack") or {}
    where = "layered env" if env.get("python") else "host"
    return f"transformers {stack.get('transformers', '?')}, torch {stack.get('torch', '?')} ({where})"


def run_target(zoo: Path, names: list[str], target: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    manifest = out / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(manifest_for(zoo, names, target, args), sort_keys=False))
    cmd = [sys.executable, "-m", "api.cli", "batch", str(manifest), "--executor", "local",
           "--workers", str(args.workers), "--out", str(out / "results")]
    with (out / "batch.log").open("w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    results = out / "results" / "results.json"
    ports = json.loads(results.read_text())["ports"] if results.is_file() else []
    by_name = {p["model"]: p for p in ports}
    rows = []
    for n in names:
        p = by_name.get(n) or {"model": n, "verdict": "failed", "reason": f"no result (see {out / 'batch.log'})"}
        report: dict[str, Any] = {}
        if p.get("bundle") and (Path(p["bundle"]) / "report.json").is_file():
            report = json.loads((Path(p["bundle"]) / "report.json").read_text())
        ok = p.get("verdict") == "validated"
        quant = (report.get("entry") or {}).get("quantized")
        rows.append({"model": n, "target": target, "status": p.get("verdict"), "runs": p.get("sandbox_runs", 0),
                     "seconds": p.get("time_s"), "model_line": first_model_line(report),
                     "class": "" if ok else failure_class(str(p.get("reason") or "")),
                     "env": env_used(report), "reason": "" if ok else str(p.get("reason") or ""),
                     # a quantized release validates its float path only (agents/reading/quant_path.py): said in the row
                     "label": "float path of a quantized checkpoint; the int kernels were not validated"
                     if quant else ""})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'release':30} {'target':10} {'status':9} {'runs':>4} {'secs':>7}  {'model line':34} class / environment")
    for r in rows:
        secs = f"{r['seconds']:.0f}" if isinstance(r["seconds"], int | float) else "-"
        print(f"{r['model']:30} {r['target']:10} {r['status']:9} {r['runs']:>4} {secs:>7}  {r['model_line'] or '-':34} "
              f"{r['class'] or 'validated'} [{r['env']}]")
        if r.get("label"):
            print(f"{'':30}   note: {r['label']}")
        if r["reason"]:
            print(f"{'':30}   reason: {r['reason'][:300]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("zoo", nargs="?", type=Path, default=DEFAULT_ZOO)
    ap.add_argument("--only", default="", help="comma-separated release names (default: all)")
    ap.add_argument("--target", choices=TARGETS, default=None, help="one target (default: both)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-runs", type=int, default=6)
    ap.add_argument("--run-timeout", type=float, default=600.0,
                    help="a hang guard per sandbox run; the port time printed is the figure judged")
    ap.add_argument("--port-timeout", type=float, default=1800.0, help="a hang guard per port")
    ap.add_argument("--out", type=Path, default=None, help="keep the batches' results here (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    if not args.zoo.is_dir():
        sys.exit(f"no zoo at {args.zoo} (pass its path)")
    args.zoo = args.zoo.resolve()  # the batch manifest lies elsewhere: a relative path would resolve from there
    names = releases(args.zoo, args.only)
    targets = [args.target] if args.target else list(TARGETS)
    with tempfile.TemporaryDirectory(prefix="npuport-zoo-") as tmp:
        out = args.out or Path(tmp)
        rows = [r for t in targets for r in run_target(args.zoo, names, t, args, out / t)]
    print_table(rows)
    times = [float(r["seconds"]) for r in rows if isinstance(r["seconds"], int | float)]
    if times:
        slow = max(rows, key=lambda r: float(r["seconds"] or 0))
        print(f"port time: median {statistics.median(times):.0f} s, slowest {max(times):.0f} s ({slow['model']}, "
              f"{slow['target']})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    n = len(names)
    done = {t: sum(1 for r in rows if r["target"] == t and r["status"] == "validated") for t in targets}
    print("zoo: validated " + ", ".join(f"{done[t]}/{n} {t}" for t in targets))
    return 0 if all(done[t] >= GOAL * n for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
