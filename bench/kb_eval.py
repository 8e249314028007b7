"""Knowledge-base benchmark: build time, rebuild time, recall@5 and query latency.

    python bench/kb_eval.py [--data ../shared/data] [--home DIR] [--wheel 2.13.0] [--matrix PATH] [--json]

Builds a knowledge base from the docs folders under --data (torch_npu_docs, ascend-pytorch-docs,
vllm-ascend-docs), the torch_npu wheel docs and, when given, an op-support matrix; builds a second
time (nothing changed: should take seconds); then runs every case of bench/kb_eval_cases.yaml and
reports recall@5 (a case counts when any expected target is in the top 5) and the p50/p95 latency
of `search` on the embedded store. The files the cases were written from (npu_runtime_facts.md,
README.md) are not ingested.
"""

from __future__ import annotations

import argparse
import json
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

CASES = Path(__file__).with_name("kb_eval_cases.yaml")
DOC_FOLDERS = ("torch_npu_docs", "ascend-pytorch-docs", "vllm-ascend-docs")


def target_hit(target: str, hit: Hit) -> bool:
    kind, _, value = target.partition(":")
    if kind == "recipe":
        return hit.id == target
    if kind == "file":
        return value in hit.source
    return target in hit.primary  # op:/env:/aclnn:/code: a chunk about that identifier


def run_cases(kb: KnowledgeBase, cases: list[dict[str, Any]], k: int = 5) -> dict[str, Any]:
    kb.search("warm up the embedder", k=k)
    latencies: list[float] = []
    failures: list[dict[str, Any]] = []
    passed = 0
    for case in cases:
        t = time.perf_counter()
        hits = kb.search(case["q"], k=k)
        latencies.append((time.perf_counter() - t) * 1000)
        if any(target_hit(tg, h) for tg in case["expect"] for h in hits):
            passed += 1
        else:
            failures.append({"q": case["q"], "expect": case["expect"], "got": [h.cite for h in hits]})
    lat = sorted(latencies)
    p95 = lat[min(len(lat) - 1, max(0, round(0.95 * len(lat)) - 1))]
    return {
        "cases": len(cases),
        "recall_at_5": round(passed / len(cases), 3),
        "latency_ms_p50": round(statistics.median(lat), 1),
        "latency_ms_p95": round(p95, 1),
        "latency_ms_max": round(lat[-1], 1),
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument(
        "--home", type=Path, default=None, help="npuport home for the store (default: a temp dir)"
    )
    ap.add_argument("--wheel", default="2.13.0", help="torch_npu version (or .whl path); '' to skip")
    ap.add_argument("--matrix", type=Path, default=None, help="op-support matrix JSON to ingest")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    sources = [str(args.data / d) for d in DOC_FOLDERS if (args.data / d).is_dir()]
    if args.wheel:
        sources.append(f"wheel:{args.wheel}")
    if args.matrix:
        sources.append(f"matrix:{args.matrix}")
    home = args.home or Path(tempfile.mkdtemp(prefix="npuport-kb-eval-"))
    kb = KnowledgeBase(home)
    first = kb.build(sources, progress=not args.json)
    second = KnowledgeBase(home).build(sources, progress=False)
    cases = yaml.safe_load(CASES.read_text(encoding="utf-8"))["cases"]
    result = run_cases(kb, cases)
    report = {
        "store": str(home),
        "sources": sources,
        "build_seconds": first.seconds,
        "build_embed_seconds": first.embed_seconds,
        "chunks": first.chunks_added,
        "collections": first.collections,
        "skipped": [s.model_dump() for s in first.skipped],
        "rebuild_unchanged_seconds": second.seconds,
        "rebuild_unchanged_files": second.unchanged,
        **result,
    }
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(
            f"build: {first.seconds:.1f}s ({first.chunks_added} chunks, embedding {first.embed_seconds:.1f}s); "
            f"unchanged rebuild: {second.seconds:.1f}s"
        )
        print(
            f"recall@5: {result['recall_at_5']:.3f} over {result['cases']} cases; "
            f"latency p50 {result['latency_ms_p50']} ms, p95 {result['latency_ms_p95']} ms"
        )
        for f in result["failures"]:
            print(f"  MISS {f['q'][:90]!r} expected {f['expect']} got {f['got']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
