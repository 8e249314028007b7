"""What the run's supervisor costs per sandbox run (sandbox/isolation/supervisor.py): the same harness run of the same
tiny model, under bwrap, alternately as the model's process alone (the harness writes its result file
itself: what a run was before the supervisor) and under the supervisor (the result on its pipe, the
worker greeting it, every call timed by it, the process watch). Prints each pair's wall times, then the
median difference (the figure, LAST). ``--empty``: the supervisor's own cost (an empty worker under it
against a bare interpreter), the part that a slow host's noise does not hide.
Usage: python bench/supervisor_overhead.py [--pairs 5] [--empty]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def empty(pairs: int) -> int:
    """The supervisor's own cost: an empty worker (sandbox/isolation/worker_channel.py as a program) under it, against a
    bare interpreter that does nothing, both under the same sandbox."""
    from sandbox.isolation.process import Limits, Mounts, default_sandbox, scrubbed_env
    from sandbox.isolation.supervised import supervised_argv

    box = default_sandbox()
    base = Path(tempfile.mkdtemp(prefix="npuport-sup-empty-"))
    diffs = []
    for i in range(pairs):
        walls = {}
        for mode in (("direct", "supervised") if i % 2 == 0 else ("supervised", "direct")):
            argv = (supervised_argv(None, "sandbox.isolation.worker_channel", base / "none", 1 << 20)
                    if mode == "supervised"
                    else [sys.executable, "-I", "-B", "-u", "-c", "pass"])
            t0 = time.monotonic()
            res = box.execute(argv, cwd=base, env=scrubbed_env(), limits=Limits(wall_s=120), mounts=Mounts(rw=(base,)),
                              result_channel=mode == "supervised", channel_cap=1 << 20)
            walls[mode] = time.monotonic() - t0
            if res.status != "ok" or (mode == "supervised" and not json.loads(res.channel)["claims"]):
                print(f"{mode} failed: {res.stderr[-800:]}", file=sys.stderr)
                return 1
        diffs.append(walls["supervised"] - walls["direct"])
        print(f"pair {i + 1}: bare {walls['direct'] * 1000:.0f} ms, supervised empty worker "
              f"{walls['supervised'] * 1000:.0f} ms ({box.name}, load {os.getloadavg()[0]:.1f})")
    print(f"supervisor's own cost per run: median {statistics.median(diffs) * 1000:+.0f} ms over {pairs} pairs "
          f"(load {os.getloadavg()[0]:.1f})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--empty", action="store_true", help="the supervisor's own cost, with an empty worker")
    args = ap.parse_args()
    if args.empty:
        return empty(args.pairs)
    from security.conftest import write_model

    from sandbox.isolation.process import Limits, Mounts, default_sandbox, scrubbed_env
    from sandbox.isolation.rundir import write_own
    from sandbox.isolation.supervised import supervised_argv

    box = default_sandbox()
    base = Path(tempfile.mkdtemp(prefix="npuport-sup-overhead-"))
    model = write_model(base / "model")
    import yaml

    manifest = yaml.safe_load((model / "npuport.yaml").read_text())
    diffs, rows = [], []
    for i in range(args.pairs):
        walls = {}
        for mode in (("direct", "supervised") if i % 2 == 0 else ("supervised", "direct")):
            run_dir = base / f"run-{i}-{mode}"
            run_dir.mkdir()
            spec = {"model_dir": str(model), "manifest": manifest, "device": "cpu", "redirect": None, "target": None,
                    "seed": 0, "warmup": 0, "repeats": 1, "profile": True,
                    "result_channel": mode == "supervised", "result_path": str(run_dir / "result.json")}
            spec_path = run_dir / "spec.json"
            write_own(spec_path, json.dumps(spec))
            argv = (supervised_argv(None, "sandbox.harness.worker", spec_path, 8 << 20) if mode == "supervised" else
                    [sys.executable, "-I", "-B", "-u", "-m", "sandbox.harness.worker", str(spec_path)])
            t0 = time.monotonic()
            res = box.execute(argv, cwd=run_dir, env=scrubbed_env(), limits=Limits(wall_s=300),
                              mounts=Mounts(ro=(model,), rw=(run_dir,)), result_channel=mode == "supervised",
                              channel_cap=(8 << 20) + 65536)
            walls[mode] = time.monotonic() - t0
            ok = (json.loads(res.channel)["claims"] or {}).get("ok") if mode == "supervised" else \
                json.loads((run_dir / "result.json").read_text()).get("ok")
            if not ok:
                print(f"{mode} run failed: {res.stderr[-1000:]}", file=sys.stderr)
                return 1
        diffs.append(walls["supervised"] - walls["direct"])
        rows.append(walls)
        print(f"pair {i + 1}: direct {walls['direct']:.2f} s, supervised {walls['supervised']:.2f} s "
              f"({box.name}, load {os.getloadavg()[0]:.1f})")
    med_direct = statistics.median(r["direct"] for r in rows)
    print(f"supervisor overhead per run: median {statistics.median(diffs) * 1000:+.0f} ms over {args.pairs} pairs "
          f"(direct median {med_direct:.2f} s; load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
