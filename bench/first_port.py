"""A first port as a user runs it (issue 41): `npuport port <release> --target ascend-sim --shrink` with the
default settings (serving on), one release after another, over zoo releases of ../shared/data/zoo and
DeepSeek-OCR-2. For each: the time to the validated bundle (the reporter's step line: the bundle is written
then) and the time the deployment phase took after it (to the command's end: vLLM started with the bundle's
serve.sh, the token gate, the throughput probe).

Goals: time to the validated bundle median <= 2 min and every one <= 5 min; the deployment <= 3 min more
(median). A release that does not validate misses the bundle goal. Prints a row per release, both medians, and
the figure last; exit 1 when a goal is missed.

DeepSeek-OCR-2 is not in ../shared/data: pass its release folder (`--dsocr2 PATH`, as bench/dsocr2_port.py takes
it; a public copy of the remote-code release, e.g. sen-ye/DeepSeek-OCR2-query-ablation, kept outside the project).
Usage: python bench/first_port.py [--zoo DIR] [--only a,b] [--dsocr2 PATH] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ZOO = ROOT.parent / "shared" / "data" / "zoo"
# Six text releases of the zoo that vLLM's own classes serve (docs/deploy.md), of different families and sizes.
DEFAULT_RELEASES = ("internlm2-chat-7b", "falcon-7b-instruct", "chatglm2-6b", "stable-code-3b", "phi-1_5-mixformer",
                    "codegeex2-6b")
BUNDLE_MEDIAN_GOAL_S = 120.0
BUNDLE_MAX_GOAL_S = 300.0
DEPLOY_MEDIAN_GOAL_S = 180.0


@dataclass
class FirstPort:
    name: str
    status: str
    exit_code: int | None
    bundle_s: float | None  # the reporter's line: the bundle is written
    end_s: float  # the command's end: the deployment phase is over
    deployment: str

    @property
    def deploy_s(self) -> float | None:
        return None if self.bundle_s is None else self.end_s - self.bundle_s


def port_once(model: Path, timeout_s: float) -> FirstPort:
    """One port, its output read line by line as it comes (the reporter's line marks the bundle)."""
    with tempfile.TemporaryDirectory(prefix="first-port-") as tmp:
        out = Path(tmp) / "bundle"
        argv = [sys.executable, "-m", "api.cli", "port", str(model), "--target", "ascend-sim", "--shrink",
                "--out", str(out)]
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ))
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        bundle_s = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if bundle_s is None and line.split()[1:2] == ["reporter"]:
                bundle_s = time.monotonic() - start
        proc.wait()
        timer.cancel()
        end_s = time.monotonic() - start
        report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    from agents.deploy.serve_report import deployment_summary

    record = report.get("deployment") or {}
    return FirstPort(name=model.name, status=str(report.get("status") or "no bundle"), exit_code=proc.returncode,
                     bundle_s=bundle_s if report else None, end_s=end_s,
                     deployment=deployment_summary(record, 120) if record else "none")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, default=DEFAULT_ZOO)
    ap.add_argument("--only", default=",".join(DEFAULT_RELEASES), help="comma-separated zoo release names")
    ap.add_argument("--dsocr2", type=Path, default=None, help="the DeepSeek-OCR-2 release folder")
    ap.add_argument("--timeout", type=float, default=1800.0, help="a hang guard per port")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    models = [args.zoo / n for n in args.only.split(",") if n]
    missing = [m for m in models if not m.is_dir()]
    if args.dsocr2 is not None:
        models.append(args.dsocr2.resolve())
    results: list[FirstPort] = []
    for model in models:
        if not model.is_dir():
            continue
        r = port_once(model, args.timeout)
        results.append(r)
        print(f"{r.name:<28} {r.status:<10} bundle {_fmt(r.bundle_s):>7}  deployment +{_fmt(r.deploy_s):>7}  "
              f"({r.deployment})", flush=True)
    validated = [r for r in results if r.status == "validated" and r.bundle_s is not None]
    bundles = [r.bundle_s for r in validated if r.bundle_s is not None]
    deploys = [r.deploy_s for r in validated if r.deploy_s is not None]
    med_bundle = statistics.median(bundles) if bundles else None
    worst = max(bundles) if bundles else None
    med_deploy = statistics.median(deploys) if deploys else None
    misses = []
    if missing:
        misses.append(f"not found: {', '.join(m.name for m in missing)}")
    if args.dsocr2 is None:
        misses.append("DeepSeek-OCR-2 not given (--dsocr2 PATH)")
    if len(validated) < len(results) or not results:
        misses.append(f"{len(results) - len(validated)} of {len(results)} did not validate")
    if med_bundle is None or med_bundle > BUNDLE_MEDIAN_GOAL_S:
        misses.append(f"bundle median {_fmt(med_bundle)} > {BUNDLE_MEDIAN_GOAL_S:.0f} s")
    if worst is None or worst > BUNDLE_MAX_GOAL_S:
        misses.append(f"slowest bundle {_fmt(worst)} > {BUNDLE_MAX_GOAL_S:.0f} s")
    if med_deploy is None or med_deploy > DEPLOY_MEDIAN_GOAL_S:
        misses.append(f"deployment median {_fmt(med_deploy)} > {DEPLOY_MEDIAN_GOAL_S:.0f} s")
    print(f"load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores; {len(validated)}/{len(results)} validated; goals: "
          f"bundle median <= {BUNDLE_MEDIAN_GOAL_S:.0f} s, each <= {BUNDLE_MAX_GOAL_S:.0f} s; deployment median <= "
          f"{DEPLOY_MEDIAN_GOAL_S:.0f} s more" + (f"; MISSED: {'; '.join(misses)}" if misses else "; met"))
    print(f"first_port: bundle median {_fmt(med_bundle)} (slowest {_fmt(worst)}), deployment median "
          f"+{_fmt(med_deploy)}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
