"""Knowledge-base benchmark on real users' errors: recall@5, MRR and search latency.

    python bench/kb_eval.py [--data ../shared/data] [--home DIR] [--split test|dev|all] [--online] [--json]

Cases: bench/kb_eval_real.yaml, error messages and symptoms quoted from public issue trackers and
pages, each with its thread, split into dev and test halves by source. The test half was collected after
npuport's notes and recipe patterns were frozen, from sources used nowhere else in the repository;
retrieval is tuned on the dev half only. The goal is judged on the test half.

Two stores are measured, both built in this run:
- "readme": exactly what README's `npuport kb build` (no arguments) builds: the torch_npu wheel, the op
  matrices of the home, the public CANN operator reference repositories (hicann/ops-*), our recipes and
  runtime-failure notes. Without --online the repositories are read from their copy in
  <data>/cann-ops-docs (the same docs a clone gives; this machine cannot reach GitHub).
- "full": the same plus every doc folder in <data> (torch_npu docs, Ascend/pytorch docs, vllm-ascend
  docs) and op-plugin's tables.

Goals: recall@5 >= 0.9 on the test half with the readme store; warm search p95 <= 100 ms. The last
line printed is the figure; the exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from knowledge.kb import Hit, KnowledgeBase  # noqa: E402
from knowledge.kb.cli_support import default_sources, optional_defaults  # noqa: E402
from knowledge.kb.sources import DEFAULT_DOC_REPOS  # noqa: E402

CASES = Path(__file__).with_name("kb_eval_real.yaml")
DOC_FOLDERS = ("torch_npu_docs", "ascend-pytorch-docs", "vllm-ascend-docs")
GOAL_RECALL = 0.9
GOAL_P95_MS = 100.0


def target_hit(target: str, hit: Hit) -> bool:
    kind, _, value = target.partition(":")
    if kind == "recipe":
        return hit.id == target
    if kind == "file":
        return value in hit.source
    return target in hit.primary  # op:/env:/aclnn:/code: a chunk about that identifier


def first_rank(case: dict[str, Any], hits: list[Hit]) -> int | None:
    for i, h in enumerate(hits, 1):
        if any(target_hit(t, h) for t in case["expect"]):
            return i
    return None


# Warm-up queries: none of them is a case, so the search's query-embedding cache cannot answer a
# measured case from the warm-up (every measured search embeds its query).
WARMUP = ("warm-up: aclnn operator dtype support", "warm-up: NPU runtime error", "warm-up: import torch_npu")


def run_cases(kb: KnowledgeBase, cases: list[dict[str, Any]], k: int = 5) -> dict[str, Any]:
    for q in WARMUP:
        kb.search(q, k=k)  # warm: the embedder, the in-memory index
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    latencies: list[float] = []
    failures: list[dict[str, Any]] = []
    found = 0
    rr = 0.0
    by_family: dict[str, list[int]] = {}
    for case in cases:
        t = time.perf_counter()
        hits = kb.search(case["q"], k=k)
        latencies.append((time.perf_counter() - t) * 1000)
        rank = first_rank(case, hits)
        forbidden = bool(hits) and any(target_hit(f, hits[0]) for f in case.get("forbid") or [])
        ok = rank is not None and not forbidden
        fam = by_family.setdefault(str(case.get("family", "")), [0, 0])
        fam[1] += 1
        if ok:
            found += 1
            fam[0] += 1
            rr += 1.0 / (rank or 1)
        else:
            failures.append(
                {
                    "q": case["q"],
                    "expect": case["expect"],
                    "forbidden_first": forbidden,
                    "got": [h.cite for h in hits],
                    "source": case.get("source", ""),
                }
            )
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    lat = sorted(latencies)
    p95 = lat[min(len(lat) - 1, max(0, round(0.95 * len(lat)) - 1))]
    n = max(1, len(cases))
    return {
        "cases": len(cases),
        "recall_at_5": round(found / n, 3),
        "mrr": round(rr / n, 3),
        "latency_ms_p50": round(statistics.median(lat), 1) if lat else 0.0,
        "latency_ms_p95": round(p95, 1) if lat else 0.0,
        "load_1min": [round(load_before, 1), round(load_after, 1)],
        "by_family": {f: f"{a}/{b}" for f, (a, b) in sorted(by_family.items())},
        "failures": failures,
    }


def readme_sources(home: Path, data: Path, online: bool) -> list[str]:
    """README's `npuport kb build`: the defaults; offline, the CANN repositories' local copy."""
    out = []
    for s in default_sources(home):
        if s in DEFAULT_DOC_REPOS and not online:
            local = data / "cann-ops-docs"
            if str(local) not in out:
                out.append(str(local))
        else:
            out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--home", type=Path, default=None, help="npuport home for the stores (default: a temp dir)")
    ap.add_argument("--split", default="test", choices=["test", "dev", "all"])
    ap.add_argument("--online", action="store_true", help="clone the CANN repositories instead of the copy")
    ap.add_argument("--skip-full", action="store_true", help="measure the readme store only")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    all_cases = yaml.safe_load(CASES.read_text(encoding="utf-8"))["cases"]
    cases = [c for c in all_cases if args.split == "all" or c.get("split") == args.split]
    root = args.home or Path(tempfile.mkdtemp(prefix="npuport-kb-eval-"))
    report: dict[str, Any] = {"cases_file": str(CASES.relative_to(REPO)), "split": args.split}

    home = root / "readme"
    home.mkdir(parents=True, exist_ok=True)
    srcs = readme_sources(home, args.data, args.online)
    t0 = time.perf_counter()
    stats = KnowledgeBase(home).build(srcs, progress=not args.json, optional=optional_defaults())
    report["readme"] = {
        "sources": srcs,
        "build_seconds": round(time.perf_counter() - t0, 1),
        "chunks": stats.chunks_added,
        "notes": stats.notes,
        **run_cases(KnowledgeBase(home), cases),
    }
    if not args.skip_full:
        full_home = root / "full"
        if not full_home.exists():
            shutil.copytree(home, full_home)  # incremental: only the extra folders are embedded
        extra = [str(args.data / d) for d in DOC_FOLDERS if (args.data / d).is_dir()]
        extra.append(f"opplugin:{args.data / 'op-plugin'}")
        t0 = time.perf_counter()
        fstats = KnowledgeBase(full_home).build(srcs + extra, progress=not args.json, optional=optional_defaults())
        report["full"] = {
            "sources": srcs + extra,
            "build_seconds": round(time.perf_counter() - t0, 1),
            "chunks_added": fstats.chunks_added,
            **run_cases(KnowledgeBase(full_home), cases),
        }
    r = report["readme"]
    ok = r["recall_at_5"] >= GOAL_RECALL and r["latency_ms_p95"] <= GOAL_P95_MS
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        for name in ("readme", "full"):
            if name not in report:
                continue
            s = report[name]
            print(
                f"[{name}] build {s['build_seconds']}s; {args.split} half: {s['cases']} cases, "
                f"recall@5 {s['recall_at_5']:.3f}, MRR {s['mrr']:.3f}, "
                f"p50 {s['latency_ms_p50']} ms, p95 {s['latency_ms_p95']} ms (load {s['load_1min'][0]}-"
                f"{s['load_1min'][1]}); by family {s['by_family']}"
            )
            for f in s["failures"]:
                why = "forbidden first hit" if f["forbidden_first"] else "not in top 5"
                print(f"   MISS ({why}) {f['q'][:90]!r} expected {f['expect']} got {f['got'][:3]}")
    print(
        f"kb_eval ({args.split} half, README store, load {load:.1f}): recall@5 {r['recall_at_5']:.3f} "
        f"(goal >= {GOAL_RECALL}), MRR {r['mrr']:.3f}, p95 {r['latency_ms_p95']} ms (goal <= {GOAL_P95_MS:.0f})"
        f" -> {'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
