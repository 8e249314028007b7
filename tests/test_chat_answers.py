"""Chat answers questions about its job (what changed, why, what is left) from the job's report.json."""

from __future__ import annotations

import json
from pathlib import Path

from api.chat_answers import answer, question_of
from api.jobs import Job
from api.routers.chat import _intent


def _job(bundle: Path | None, status: str = "validated") -> Job:
    return Job(id="j1", created=0, updated=0, status=status, goal="", request={}, require_approval=False, owner="o",
               conversation=None, reason="", bundle_dir=str(bundle) if bundle else None, upload_dir=None, started=True)


def test_questions_are_recognised_and_goals_still_start_ports() -> None:
    assert _intent("what did you change?", True) == "question" and question_of("what did you change?") == "changed"
    assert question_of("why?") == "why" and question_of("what is left to do?") == "left"
    assert _intent("what is left?", True) == "question"
    assert _intent("port the model in ./m to Ascend 910B", True) == "goal"
    assert _intent("how is it going", True) == "status" and _intent("report", True) == "report"


def test_answers_come_from_the_report(tmp_path: Path) -> None:
    report = {"status": "validated", "reason": "tokens match",
              "patches": [{"summary": "H1 device-agnostic: 3 finding(s)", "files": ["modeling.py"]}],
              "findings": [{"id": "a", "file": "modeling.py", "line": 3, "hazard": "H1", "category": "blocks running",
                            "message": "hard-coded cuda"},
                           {"id": "b", "file": "modeling.py", "line": 9, "hazard": "H6", "category": "slows down",
                            "message": "loop"}],
              "resolutions": {"a": "fixed by patch-1 (abc, device-agnostic)", "b": "left as written: a loop"},
              "numerics": {"verdict": "match", "detail": "greedy tokens identical"},
              "perf": {"pathologies": [{"title": "no KV cache", "where": "modeling.py:40"}]}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    job = _job(tmp_path)
    changed = answer(job, "changed")
    assert "1 change(s)" in changed and "H1 device-agnostic" in changed and "modeling.py" in changed
    why = answer(job, "why")
    assert "modeling.py:3 H1" in why and "fixed by patch-1" in why and "validation: match" in why
    left = answer(job, "left")
    assert "modeling.py:9 H6" in left and "no KV cache at modeling.py:40" in left and "modeling.py:3" not in left
    assert "has not written its report yet" in answer(_job(None, "running"), "changed")
