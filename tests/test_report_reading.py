"""report.md reads in one screen (issue 27): summary first, the model's own blockers first, token ids
summarised, only measured sections, every file:line pointing into the user's files; report.json keeps
everything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.report.bundle import write_bundle
from agents.report.markdown import ordered_findings, user_site


def _finding(i: int, file: str, line: int, category: str, severity: str, hazard: str = "H1") -> dict[str, Any]:
    return {"id": f"f{i}", "hazard": hazard, "rule": "r", "file": file, "line": line, "col": 0, "category": category,
            "severity": severity, "message": f"finding {i}", "fixable": False, "citations": []}


def _state(model: Path, tokens: list[int]) -> dict[str, Any]:
    findings = [_finding(0, "scripts/research_eval.py", 3, "blocks running", "high"),
                _finding(1, "modeling_m.py", 2, "slows down", "low", "H6"),
                _finding(2, "modeling_m.py", 4, "blocks running", "high"),
                _finding(3, "helpers.py", 1, "changes numbers", "medium", "H5")]
    findings += [_finding(10 + i, "scripts/research_eval.py", 1, "slows down", "low", "H6") for i in range(30)]
    return {"request": {"model_path": str(model), "chip": "910b", "torch_npu": "2.13.0"}, "status": "validated",
            "entry": {"entry": {"class": "modeling_m:M"}}, "findings": findings, "patches": [], "runs": [],
            "diagnoses": [], "counters": {"port_runs": 1, "reference_runs": 1}, "trace": [],
            "numerics": {"verdict": "match", "detail": "greedy tokens identical", "reference_tokens": [tokens],
                         "port_tokens": [tokens]},
            "tuning": {"status": "skipped", "detail": "tuning not requested", "tuned": {"run_s": 1.0}},
            "perf": {"profiled": True, "pathologies": [
                {"kind": "no-kv-cache", "title": "decode cost grows with the position", "where": "modeling_m.py:906",
                 "cause": "no KV cache", "evidence": "", "fix": ""},
                {"kind": "x", "title": "the whole output is decoded every step",
                 "where": "/usr/lib/python3/site-packages/transformers/generation/utils.py:2400", "cause": "",
                 "evidence": "", "fix": ""}]}}


def test_report_md_is_one_screen_with_the_summary_and_the_model_s_blockers_first(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "scripts").mkdir(parents=True)
    (model / "modeling_m.py").write_text("import torch\n" * 10)
    (model / "helpers.py").write_text("x = 1\n")
    (model / "scripts" / "research_eval.py").write_text("a\nb\nc\n")
    tokens = list(range(294))
    out = tmp_path / "bundle"
    write_bundle(_state(model, tokens), out, "validated", "the port runs")
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    head = "\n".join(lines[:12])
    for word in ("**Changed:**", "**Left:**", "**Slow on the NPU:**", "report.json"):
        assert word in head, head
    assert md.count(", ".join(str(t) for t in tokens[:20])) <= 2
    assert str(tokens[200]) not in md.split("## Validation")[1]
    table = [ln for ln in lines if ln.startswith("| H")]
    assert table[0].startswith("| H1 blocks running, high | modeling_m.py:4 "), table[:3]
    assert "research_eval.py" in table[-1] and len(table) <= 15
    assert "more finding(s) in `report.json`" in md
    # only measured sections: no tuning ran, so no Tuning or Benchmark section and no "None" concurrency
    assert "## Tuning" not in md and "concurrency None" not in md and "{}" not in md
    # every file:line is in the user's files, or says it is not
    assert "modeling_m.py:906 (outside the model's files)" in md
    assert "transformers/generation/utils.py:2400 (outside the model's files)" in md
    assert len(lines) < 120, len(lines)
    data = json.loads((out / "report.json").read_text())
    assert data["numerics"]["port_tokens"] == [tokens] and len(data["findings"]) == 34


def test_user_site_and_order(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "a.py").write_text("1\n2\n3\n")
    report = {"request": {"model_path": str(model)}, "workdir": str(tmp_path / "ws"),
              "entry": {"entry": {"class": "a:M"}},
              "findings": [_finding(1, "tests/test_a.py", 1, "blocks running", "high"),
                           _finding(2, "a.py", 3, "slows down", "low")]}
    assert user_site("a.py:3", report) == "a.py:3"
    assert user_site(f"{model}/a.py:2", report) == "a.py:2"
    assert user_site("a.py:4", report).endswith("(outside the model's files)")
    (tmp_path / "ws" / "model").mkdir(parents=True)
    (tmp_path / "ws" / "model" / "a.py").write_text("1\n" * 9)
    assert user_site("a.py:8", report) == "a.py:8 (in patched/)"
    assert [f["file"] for f in ordered_findings(report)] == ["a.py", "tests/test_a.py"]
