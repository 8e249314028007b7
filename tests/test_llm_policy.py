"""The LLM policy, its tools and edits, and the hybrid policy, driven by scripted fake chat models.

Only the LLM service is faked (tests/llm_stub.ScriptedChatModel answers from a script of AIMessages,
tool calls included); the tools, validation, budget, workspace and patcher are the real code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from agents.fixing.codemods import CODEMODS, LLM_EDIT
from agents.fixing.commits import apply_fix
from agents.fixing.llm_edits import LLMEdit, SearchReplace, apply_llm_edit, diff_to_edits, llm_edit_codemod
from agents.llm.client import TokenBudget
from agents.llm.prompts import PROMPTS_DIR, load_prompt
from agents.llm.tools import ToolBox, bounded
from agents.models import Citation, Diagnosis, Finding, Frame, HazardCategory, Severity, StructuredException
from agents.policies import PolicyContext, RulePolicy, get_policy
from agents.policies.hybrid import HybridPolicy
from agents.policies.llm import LLMPolicy
from agents.workspace import Workspace
from knowledge.settings import LLMSettings
from tests.llm_stub import ScriptedChatModel, ai_text, ai_tool_call

SOURCE = '''import torch


def scale(x):
    mode = "fast"
    if mode != "exact":
        raise RuntimeError("planted: unsupported mode " + mode)
    return x * 2
'''
SEARCH = '    if mode != "exact":\n'
REPLACE = '    if mode not in ("exact", "fast"):\n'


@pytest.fixture(autouse=True)
def no_llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may reach a configured endpoint: the user's settings are cleared."""
    for k in ("NPUPORT_LLM_BASE_URL", "NPUPORT_LLM_MODEL", "NPUPORT_LLM_API_KEY", "NPUPORT_LLM_TOKEN_BUDGET"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture()
def ws(tmp_path: Path) -> Workspace:
    model = tmp_path / "orig"
    model.mkdir()
    (model / "mod.py").write_text(SOURCE)
    (model / "other.py").write_text("x = 1\ny = 2\n")
    return Workspace.create(model, tmp_path / "work")


def exc_in_mod() -> StructuredException:
    return StructuredException(type="RuntimeError", message="planted: unsupported mode fast",
                               frames=[Frame(file="/usr/lib/harness.py", line=3, func="main"),
                                       Frame(file="mod.py", line=7, func="scale", code='raise RuntimeError(...)',
                                             in_model=True)])


def edit_answer(search: str = SEARCH, replace: str = REPLACE, call_id: str = "call_9", tokens: int = 100) -> Any:
    return ai_tool_call("DiagnosisAnswer", {
        "kind": "unsupported-mode", "summary": "scale rejects its own fast mode", "file": "mod.py", "line": 6,
        "fix": {"edits": [{"file": "mod.py", "search": search, "replace": replace}]},
        "citations": ["recipe:H5"]}, call_id=call_id, tokens=tokens)


def policy_for(ws: Workspace | None, script: list[Any], **settings: Any) -> tuple[LLMPolicy, ScriptedChatModel]:
    chat = ScriptedChatModel.of(script)
    ctx = PolicyContext(workdir=ws.root) if ws else None
    return LLMPolicy(LLMSettings(**settings), chat_model=chat, context=ctx), chat


# ----------------------------------------------------------------------------------------- edits


def test_apply_llm_edit_writes_a_clean_search_replace(ws: Workspace) -> None:
    res = apply_llm_edit(ws.model_dir, {"edits": [{"file": "mod.py", "search": SEARCH, "replace": REPLACE}]})
    assert res.ok and res.changed and res.files == ["mod.py"]
    assert res.edits == ["mod.py line 6: replaced 1 line(s) with 1 (LLM edit)"]
    assert REPLACE in (ws.model_dir / "mod.py").read_text()


@pytest.mark.parametrize(("edit", "why"), [
    ({"file": "../orig/mod.py", "search": SEARCH, "replace": REPLACE}, "outside the model"),
    ({"file": "/etc/passwd", "search": "root", "replace": "x"}, "relative to the model root"),
    ({"file": ".git/config", "search": "[core]", "replace": "x"}, "outside the model"),
    ({"file": "new.py", "search": "a", "replace": "b"}, "no such file"),
    ({"file": "mod.py", "search": "    if mode == 'exact':\n", "replace": REPLACE}, "not in the file"),
    ({"file": "other.py", "search": " = ", "replace": " == "}, "occurs 2 times"),
    ({"file": "mod.py", "search": SEARCH, "replace": "    if mode not in (:\n"}, "does not parse"),
    ({"file": "mod.py", "search": SEARCH, "replace": SEARCH}, "changes nothing"),
    ({"file": "mod.py", "search": "  \n", "replace": "x"}, "empty search"),
])
def test_apply_llm_edit_rejects_what_it_cannot_apply_safely(ws: Workspace, edit: dict[str, str], why: str) -> None:
    before = (ws.model_dir / "mod.py").read_text()
    res = apply_llm_edit(ws.model_dir, {"edits": [edit]})
    assert not res.ok and not res.changed
    assert why in " ".join(res.errors)
    assert (ws.model_dir / "mod.py").read_text() == before


def test_apply_llm_edit_is_all_or_nothing(ws: Workspace) -> None:
    edits = [{"file": "mod.py", "search": SEARCH, "replace": REPLACE},
             {"file": "other.py", "search": "z = 3\n", "replace": "z = 4\n"}]
    res = apply_llm_edit(ws.model_dir, {"edits": edits})
    assert not res.ok and "other.py" in res.errors[0]
    assert (ws.model_dir / "mod.py").read_text() == SOURCE


def test_unified_diff_becomes_search_replace_and_applies(ws: Workspace) -> None:
    diff = ("--- a/mod.py\n+++ b/mod.py\n@@ -5,3 +5,3 @@ def scale(x):\n"
            '     mode = "fast"\n-    if mode != "exact":\n+    if mode not in ("exact", "fast"):\n'
            '         raise RuntimeError("planted: unsupported mode " + mode)\n')
    blocks = diff_to_edits(diff)
    assert [b.file for b in blocks] == ["mod.py"] and SEARCH in blocks[0].search and REPLACE in blocks[0].replace
    res = apply_llm_edit(ws.model_dir, LLMEdit(diff=diff), write=False)
    assert res.ok and REPLACE in res.sources["mod.py"]
    assert (ws.model_dir / "mod.py").read_text() == SOURCE  # write=False only validates


def test_line_number_prefixes_copied_from_read_file_are_tolerated(ws: Workspace) -> None:
    res = apply_llm_edit(ws.model_dir, {"edits": [{"file": "mod.py", "search": '    6|     if mode != "exact":\n',
                                                   "replace": REPLACE}]})
    assert res.ok, res.errors


def test_llm_edit_codemod_is_registered_and_applies_only_its_files_blocks() -> None:
    fn, hazard, _ = CODEMODS[LLM_EDIT]
    assert fn is llm_edit_codemod and hazard == "LLM"
    edits = [{"file": "mod.py", "search": SEARCH, "replace": REPLACE},
             {"file": "other.py", "search": "x = 1\n", "replace": "x = 10\n"}]
    mine = fn(SOURCE, edits=edits, file="mod.py")
    assert mine.changed and REPLACE in mine.source and "x = 10" not in mine.source
    guessed = fn("x = 1\ny = 2\n", edits=edits)  # file unknown: the blocks found in this source
    assert guessed.changed and guessed.source == "x = 10\ny = 2\n"
    broken = fn(SOURCE, edits=[{"file": "mod.py", "search": SEARCH, "replace": "    if (:\n"}], file="mod.py")
    assert not broken.changed and broken.source == SOURCE and "does not parse" in broken.edits[0]


def test_patcher_commits_an_llm_edit_fix(ws: Workspace) -> None:
    diag = Diagnosis(id="diag-1", run_id="run-1", signature="exception:RuntimeError@mod.py:7", kind="unsupported-mode",
                     summary="scale rejects fast", file="mod.py", line=6, fix=LLM_EDIT,
                     params={"by": "llm", "llm_tokens": 12, "edits": [{"file": "mod.py", "search": SEARCH,
                                                                      "replace": REPLACE}]},
                     citations=[Citation(source="recipe:H5")])
    action = LLMPolicy(LLMSettings()).fix_for(diag)
    assert action is not None and action.params == {"edits": diag.params["edits"]}  # no bookkeeping params
    patch, notes = apply_fix(ws, action, 1)
    assert patch is not None, notes
    assert patch.codemod == LLM_EDIT and patch.files == ["mod.py"] and patch.diagnosis_id == "diag-1"
    log = ws.git("log", "-1", "--format=%B")
    assert "llm-edit" in log and "diag-1" in log and "recipe:H5" in log


# ----------------------------------------------------------------------------------------- diagnose


def test_diagnose_reads_the_file_with_a_tool_then_proposes_a_validated_edit(ws: Workspace) -> None:
    policy, chat = policy_for(ws, [ai_tool_call("read_file", {"path": "mod.py"}, tokens=300), edit_answer(tokens=120)])
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix == LLM_EDIT and diag.kind == "unsupported-mode" and diag.params["by"] == "llm"
    assert diag.signature == "exception:RuntimeError@mod.py:7"  # the classifier's, stable for loop detection
    assert diag.params["edits"] == [{"file": "mod.py", "search": SEARCH, "replace": REPLACE}]
    assert diag.params["llm_tokens"] == 420 and diag.citations[0].source == "recipe:H5"
    assert "read_file" in chat.bound[0] and "DiagnosisAnswer" in chat.bound[0]
    tool_result = chat.seen[1][-1]
    assert isinstance(tool_result, ToolMessage) and '7|         raise RuntimeError("planted' in tool_result.content
    assert "npuport debugger" in str(chat.seen[0][0].content)
    assert json.loads((ws.root / "llm_usage.json").read_text())["tokens"] == 420
    assert (ws.model_dir / "mod.py").read_text() == SOURCE  # diagnosing writes nothing


def test_an_edit_that_does_not_apply_goes_back_to_the_model_with_the_reason(ws: Workspace) -> None:
    policy, chat = policy_for(ws, [edit_answer(search="    if mode is not 'exact':\n", call_id="a"),
                                   edit_answer(call_id="b")])
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix == LLM_EDIT
    rejection = chat.seen[1][-1]
    assert isinstance(rejection, ToolMessage) and rejection.tool_call_id == "a"
    assert "rejected" in rejection.content and "not in the file" in rejection.content


def test_answers_that_stay_invalid_end_in_a_diagnosis_without_fix(ws: Workspace) -> None:
    bad = "    nope\n"
    policy, _ = policy_for(ws, [edit_answer(search=bad, call_id=str(i)) for i in range(3)], max_answer_retries=2)
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix is None and "no usable fix" in diag.summary and "not in the file" in diag.summary


def test_a_text_answer_falls_back_to_structured_output(ws: Workspace) -> None:
    policy, chat = policy_for(ws, [ai_text("The mode check rejects 'fast'."), edit_answer()])
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix == LLM_EDIT
    assert chat.bound[-1] == ["DiagnosisAnswer"] and chat.tool_choices[-1] == "any"  # with_structured_output
    assert "Give your answer now as DiagnosisAnswer" in str(chat.seen[-1][-1].content)


def test_the_model_may_choose_an_existing_codemod_which_is_dry_run_first(ws: Workspace) -> None:
    (ws.model_dir / "dev.py").write_text("import torch\n\n\ndef f(x):\n    return x.cuda()\n")
    ws.commit("add dev.py")
    useless = ai_tool_call("DiagnosisAnswer", {"kind": "k", "summary": "s", "fix": {"codemod": "float64-to-float32",
                                                                                    "file": "dev.py"}}, call_id="u")
    good = ai_tool_call("DiagnosisAnswer", {"kind": "cuda-call", "summary": "hard-coded cuda", "file": "dev.py",
                                            "fix": {"codemod": "device-agnostic", "file": "dev.py"}}, call_id="g")
    policy, chat = policy_for(ws, [useless, good])
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix == "device-agnostic" and diag.file == "dev.py"
    assert "changes nothing in dev.py" in str(chat.seen[1][-1].content)
    action = policy.fix_for(diag)
    assert action is not None and action.codemod == "device-agnostic" and action.files == ["dev.py"]
    assert action.params == {}


def test_token_budget_stops_the_policy_and_says_so(ws: Workspace) -> None:
    policy, chat = policy_for(ws, [ai_tool_call("read_file", {"path": "mod.py"}, tokens=900)], token_budget=500)
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix is None and diag.params["budget_exhausted"] is True
    assert "token budget of 500 tokens is spent (900 used)" in diag.summary
    assert len(chat.seen) == 1  # stopped after the call that spent it
    # The next node builds a fresh policy: the workspace ledger remembers, so no call is made at all.
    again, chat2 = policy_for(ws, [], token_budget=500)
    later = again.diagnose("run-2", exc_in_mod(), [diag])
    assert later.fix is None and "spent" in later.summary and chat2.seen == []


def test_budget_counts_an_estimate_when_the_server_reports_no_usage() -> None:
    budget = TokenBudget(10)
    from langchain_core.messages import AIMessage, HumanMessage

    from agents.llm.client import tokens_of

    n = tokens_of(AIMessage(content="x" * 40), [HumanMessage("y" * 400)])
    assert 100 <= n <= 120
    budget.add(n)
    assert budget.exhausted


def test_same_signature_after_llm_fixes_stops_without_calling_the_model(ws: Workspace) -> None:
    sig = "exception:RuntimeError@mod.py:7"
    history = [Diagnosis(id=f"diag-{i}", run_id=f"run-{i}", signature=sig, kind="k", summary="s", fix=LLM_EDIT,
                         params={"by": "llm"}) for i in (1, 2)]
    policy, chat = policy_for(ws, [], max_fix_attempts=2)
    diag = policy.diagnose("run-3", exc_in_mod(), history)
    assert diag.fix is None and "came back after 2 LLM fix(es)" in diag.summary and chat.seen == []


def test_earlier_attempts_are_shown_to_the_model(ws: Workspace) -> None:
    earlier = Diagnosis(id="diag-1", run_id="run-1", signature="exception:RuntimeError@mod.py:7", kind="k",
                        summary="first try", fix=LLM_EDIT, params={"by": "llm", "edits": [{"file": "mod.py",
                                                                                          "search": "a",
                                                                                          "replace": "b"}]})
    policy, chat = policy_for(ws, [edit_answer()])
    policy.diagnose("run-2", exc_in_mod(), [earlier])
    question = str(chat.seen[0][1].content)
    assert "diag-1" in question and "first try" in question and '"search": "a"' in question


def test_unreachable_llm_ends_in_a_report_not_a_crash() -> None:
    policy = LLMPolicy(LLMSettings())  # nothing configured
    diag = policy.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix is None and "no LLM is configured" in diag.summary


# ----------------------------------------------------------------------------------------- plan_fixes


def _finding(fid: str, hazard: str, file: str = "mod.py", line: int = 1, fixable: bool = True) -> Finding:
    return Finding(id=fid, hazard=hazard, rule="r", file=file, line=line, message="m",
                   category=HazardCategory.BLOCKS_RUNNING, severity=Severity.HIGH, fixable=fixable,
                   citations=[Citation(source=f"recipe:{hazard}")])


def test_plan_fixes_validates_the_plan_and_maps_it_to_actions(ws: Workspace) -> None:
    findings = [_finding("H1-mod.py-1-r", "H1"), _finding("H9-mod.py-6-r", "H9", line=6, fixable=False)]
    wrong = ai_tool_call("FixPlan", {"fixes": [{"codemod": "device-agnostic", "finding_ids": ["H1-nope"]}]}, "p1")
    right = ai_tool_call("FixPlan", {"fixes": [
        {"codemod": "device-agnostic", "finding_ids": ["H1-mod.py-1-r"], "summary": "devices"},
        {"finding_ids": ["H9-mod.py-6-r"], "summary": "accept the fast mode",
         "edits": [{"file": "mod.py", "search": SEARCH, "replace": REPLACE}]}]}, "p2")
    policy, chat = policy_for(ws, [wrong, right])
    actions = policy.plan_fixes(findings)
    assert "unknown finding ids ['H1-nope']" in str(chat.seen[1][-1].content)
    assert [a.codemod for a in actions] == ["device-agnostic", LLM_EDIT]
    assert actions[0].files == ["mod.py"] and actions[0].citations[0].source == "recipe:H1"
    assert actions[1].params["edits"][0]["replace"] == REPLACE and actions[1].finding_ids == ["H9-mod.py-6-r"]
    assert "npuport patcher" in str(chat.seen[0][0].content)


def test_plan_fixes_falls_back_to_the_rule_plan_when_the_llm_cannot_answer(ws: Workspace) -> None:
    findings = [_finding("H1-mod.py-1-r", "H1")]
    policy, _ = policy_for(ws, [ai_tool_call("read_file", {"path": "mod.py"}, tokens=10_000)], token_budget=100)
    assert policy.plan_fixes(findings) == RulePolicy().plan_fixes(findings)
    assert policy.plan_fixes([]) == []


# ----------------------------------------------------------------------------------------- hybrid


def test_hybrid_keeps_the_rules_when_a_recipe_applies() -> None:
    chat = ScriptedChatModel.of([])
    hybrid = HybridPolicy(LLMSettings(), chat_model=chat)
    exc = StructuredException(type="ModuleNotFoundError", message="No module named 'flash_attn'",
                              frames=[Frame(file="mod.py", line=1, in_model=True)])
    diag = hybrid.diagnose("run-1", exc, [])
    assert diag.fix == "guard-cuda-only-imports" and chat.seen == []
    action = hybrid.fix_for(diag)
    assert action is not None and action.codemod == "guard-cuda-only-imports"
    findings = [_finding("H1-mod.py-1-cuda-call", "H1").model_copy(update={"rule": "cuda-call"})]
    assert hybrid.plan_fixes(findings) == RulePolicy().plan_fixes(findings) != []


def test_hybrid_escalates_when_no_recipe_covers_the_failure(ws: Workspace) -> None:
    chat = ScriptedChatModel.of([edit_answer()])
    hybrid = HybridPolicy(LLMSettings(), chat_model=chat, context=PolicyContext(workdir=ws.root))
    diag = hybrid.diagnose("run-1", exc_in_mod(), [])
    assert diag.fix == LLM_EDIT and "no recipe" not in diag.summary
    assert "The offline rules say:" in str(chat.seen[0][1].content)
    action = hybrid.fix_for(diag)
    assert action is not None and action.codemod == LLM_EDIT


def test_hybrid_escalates_when_a_recipe_made_no_progress(ws: Workspace) -> None:
    exc = StructuredException(type="RuntimeError", message="Expected all tensors to be on the same device",
                              frames=[Frame(file="mod.py", line=7, in_model=True)])
    first = RulePolicy().diagnose("run-1", exc, [])
    assert first.fix == "align-devices"
    chat = ScriptedChatModel.of([edit_answer()])
    diag = HybridPolicy(LLMSettings(), chat_model=chat, context=PolicyContext(workdir=ws.root)).diagnose(
        "run-2", exc, [first])
    assert diag.params["by"] == "llm" and diag.fix == LLM_EDIT and len(chat.seen) == 1


def test_hybrid_without_an_llm_says_how_to_configure_one() -> None:
    diag = HybridPolicy(LLMSettings()).diagnose("run-1", exc_in_mod(), [])
    assert diag.fix is None and "NPUPORT_LLM_BASE_URL" in diag.summary


def test_get_policy_names_and_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert isinstance(get_policy(), RulePolicy)
    assert isinstance(get_policy("llm"), LLMPolicy) and isinstance(get_policy("hybrid"), HybridPolicy)
    with pytest.raises(ValueError, match="hybrid"):
        get_policy("oracle")
    monkeypatch.setenv("NPUPORT_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("NPUPORT_LLM_MODEL", "m")
    monkeypatch.setenv("NPUPORT_LLM_TOKEN_BUDGET", "1234")
    p = get_policy("hybrid", context=PolicyContext(workdir=tmp_path))
    assert isinstance(p, HybridPolicy) and p.llm_available and p.llm.budget.limit == 1234
    chat = p.llm.chat_model()
    assert type(chat).__name__ == "ChatOpenAI" and str(chat.openai_api_base) == "http://127.0.0.1:9/v1"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------- other agents


def test_understand_goal_refuses_a_path_that_is_not_in_the_goal() -> None:
    invented = ai_tool_call("GoalAnswer", {"model_path": "/models/other", "target": "npu"}, "g1")
    right = ai_tool_call("GoalAnswer", {"model_path": "./my_model", "target": "ascend-sim", "chip": "a3",
                                        "tune": True}, "g2")
    policy, chat = policy_for(None, [ai_text("thinking"), invented, right])
    fields = policy.understand_goal("bring ./my_model up on the emulated A3 and make it fast")
    assert fields == {"model_path": "./my_model", "target": "ascend-sim", "chip": "a3", "tune": True}
    assert "is not in the goal" in str(chat.seen[-1][-1].content)
    assert chat.bound[0] == ["GoalAnswer"]  # the planner has no tools: it only reads the goal


def test_review_findings_adds_checked_hazards_the_scan_missed(ws: Workspace) -> None:
    missed = {"hazard": "H7", "rule": "host-sync", "file": "mod.py", "line": 8, "message": "sync",
              "category": "slows down", "severity": "low"}
    wrong_line = ai_tool_call("ReviewAnswer", {"findings": [{**missed, "line": 80}]}, "r1")
    right = ai_tool_call("ReviewAnswer", {"findings": [missed, {**missed, "hazard": "H1", "line": 1}]}, "r2")
    policy, chat = policy_for(ws, [ai_tool_call("grep", {"pattern": "mode"}, "g"), wrong_line, right])
    found = policy.review_findings([_finding("H1-mod.py-1-r", "H1")])
    assert "mod.py:5: mode = \"fast\"" in str(chat.seen[1][-1].content)  # the grep result
    assert "has no line 80" in str(chat.seen[2][-1].content)
    assert [(f.hazard, f.line, f.snippet) for f in found] == [("H7", 8, "return x * 2")]  # H1@1 was known
    assert found[0].rule == "llm-host-sync" and not found[0].fixable
    assert "npuport code reader" in str(chat.seen[0][0].content)


def test_suggest_trials_keeps_values_in_the_space_and_skips_tried_ones() -> None:
    space: dict[str, list[Any]] = {"batch": [1, 2, 4], "dtype": ["float32", "bfloat16"]}
    bad = ai_tool_call("TrialsAnswer", {"trials": [{"batch": 3}]}, "t1")
    good = ai_tool_call("TrialsAnswer", {"trials": [{"batch": 1, "dtype": "float32"}, {"batch": 4, "dtype": "bfloat16"},
                                                    {"batch": 4, "dtype": "bfloat16"}]}, "t2")
    policy, chat = policy_for(None, [bad, good])
    trials = policy.suggest_trials(space, [{"batch": 1, "dtype": "float32"}], "throughput")
    assert trials == [{"batch": 4, "dtype": "bfloat16"}]
    assert "batch=3 is not one of [1, 2, 4]" in str(chat.seen[1][-1].content)
    assert "npuport tuner" in str(chat.seen[0][0].content)


def test_every_agent_has_a_prompt() -> None:
    for agent in ("planner", "code_reader", "patcher", "debugger", "tuner"):
        assert (PROMPTS_DIR / f"{agent}.md").is_file()
        assert len(load_prompt(agent)) > 200
    with pytest.raises(FileNotFoundError):
        load_prompt("oracle")


# ----------------------------------------------------------------------------------------- tools


def test_read_file_is_numbered_bounded_and_stays_in_the_model(ws: Workspace) -> None:
    big = "\n".join(f"line_{i} = {i}" for i in range(1000)) + "\n"
    (ws.model_dir / "big.py").write_text(big)
    box = ToolBox(model_dir=ws.model_dir, max_chars=3000)
    out = box.run("read_file", {"path": "mod.py", "start_line": 6, "end_line": 7})
    assert out.startswith('    6|     if mode != "exact":') and "[mod.py: lines 6-7 of 8]" in out
    long = box.run("read_file", {"path": "big.py"})
    assert len(long) <= 3000 and "characters cut" in long and "line_0 = 0" in long
    assert box.run("read_file", {"path": "../orig/mod.py"}).startswith("error:")
    assert box.run("read_file", {"path": "nope.py"}) == "error: nope.py: no such file in the model"
    assert box.run("read_file", {"start_line": 1}).startswith("error: bad arguments for read_file")
    assert box.run("rm_rf", {}).startswith("error: no tool 'rm_rf'")
    assert [e["tool"] for e in box.log] == ["read_file"] * 5 + ["rm_rf"]


def test_grep_and_search_kb(ws: Workspace) -> None:
    box = ToolBox(model_dir=ws.model_dir, kb_search=lambda q, k: [{"cite": "recipe:H5", "title": "float64",
                                                                   "text": "no   float64 kernels " * 3}][:k])
    assert box.run("grep", {"pattern": r"raise \w+"}) == \
        'mod.py:7: raise RuntimeError("planted: unsupported mode " + mode)'
    assert box.run("grep", {"pattern": "MODE", "ignore_case": True}).count("mod.py:") == 3
    assert box.run("grep", {"pattern": "("}).startswith("error:")
    assert box.run("search_kb", {"query": "DT_DOUBLE"}).startswith("[recipe:H5] float64\nno float64 kernels")


def test_grep_stays_inside_the_workspace(ws: Workspace, tmp_path: Path) -> None:
    secret = ws.model_dir.parent / "outside.txt"
    secret.write_text("SECRET=1\n")
    (ws.model_dir / "link.txt").symlink_to(secret)
    box = ToolBox(model_dir=ws.model_dir)
    assert "must stay inside" in box.run("grep", {"pattern": "SECRET", "glob": "../*.txt"})
    assert "must stay inside" in box.run("grep", {"pattern": "SECRET", "glob": "/etc/*"})
    assert "SECRET" not in box.run("grep", {"pattern": "SECRET", "glob": "*.txt"})


def test_search_kb_default_uses_our_recipes_when_no_index_is_built(npuport_home: Path) -> None:
    out = ToolBox(model_dir=None).run("search_kb", {"query": "Torch not compiled with CUDA enabled"})
    assert "[recipe:H1]" in out


def test_run_in_sandbox_runs_a_snippet_and_undoes_workspace_writes(ws: Workspace,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", "secret-value")
    refused = ToolBox(model_dir=ws.model_dir).run("run_in_sandbox", {"code": "print(1)"})
    assert "needs bubblewrap isolation" in refused  # no bwrap: the tool is off unless allowed
    monkeypatch.setenv("NPUPORT_LLM_ALLOW_PROCESS_SANDBOX", "1")
    box = ToolBox(model_dir=ws.model_dir, max_sandbox_calls=2)
    code = ("import os, mod; print('scaled', mod.__name__); print(os.environ.get('NPUPORT_LLM_API_KEY'));"
            "open(os.path.join(os.path.dirname(mod.__file__), 'mod.py'), 'w').write('broken')")
    out = box.run("run_in_sandbox", {"code": code})
    assert "status: ok" in out and "scaled mod" in out and "secret-value" not in out
    assert "changes were undone" in out and (ws.model_dir / "mod.py").read_text() == SOURCE
    assert "status: error" in box.run("run_in_sandbox", {"code": "raise SystemExit(3)"})
    assert "per question" in box.run("run_in_sandbox", {"code": "print(1)"})


def test_bounded_keeps_head_and_tail() -> None:
    text = "A" * 500 + "B" * 500
    out = bounded(text, 300)
    assert len(out) <= 300 and out.startswith("A") and out.endswith("B") and "700 characters cut" in out
    assert bounded("short", 300) == "short"


def test_search_replace_schema_is_what_the_model_sees() -> None:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    spec = convert_to_openai_tool(SearchReplace)["function"]
    assert set(spec["parameters"]["required"]) == {"file", "search", "replace"}


# ----------------------------------------------------------------------------- fallbacks and reasoning


def cuda_assert_in_mod() -> StructuredException:
    """A failure a recipe covers (H1: CUDA called on a host without it)."""
    return StructuredException(type="AssertionError", message="Torch not compiled with CUDA enabled",
                               frames=[Frame(file="mod.py", line=3, func="scale", code="x.cuda()", in_model=True)])


def test_llm_debugger_that_gives_nothing_falls_back_to_the_rule_recipe(ws: Workspace) -> None:
    policy, chat = policy_for(ws, [])  # the script is empty: the call fails like an unreachable service
    diag = policy.diagnose("run-1", cuda_assert_in_mod(), [])
    assert len(chat.seen) == 1
    assert diag.fix == "device-agnostic" and diag.params.get("by") != "llm"
    assert "the LLM gave no usable fix (AssertionError: the scripted LLM" in diag.summary
    assert "the rules decided: device-agnostic" in diag.summary
    assert len(policy.notes) == 1 and policy.notes[0].endswith("the rules decided: device-agnostic")
    action = policy.fix_for(diag)
    assert action is not None and action.codemod == "device-agnostic" and action.files == ["mod.py"]
    # No recipe covers the failure: no fix, and the reason says both sides gave up.
    policy2, _ = policy_for(ws, [])
    none = policy2.diagnose("run-2", exc_in_mod(), [])
    assert none.fix is None and none.params["by"] == "llm" and "the LLM gave no usable fix" in none.summary
    assert policy2.notes[-1].endswith("the rules have no fix either")


def test_malformed_answers_count_against_the_retries(ws: Workspace) -> None:
    from langchain_core.messages import AIMessage

    from knowledge.errors import AnswerRejected

    def bad(i: int) -> AIMessage:
        return AIMessage(content="", invalid_tool_calls=[{"name": "ReviewAnswer", "args": '{"findings": [',
                                                          "id": f"c{i}", "error": "bad json",
                                                          "type": "invalid_tool_call"}])

    policy, chat = policy_for(ws, [bad(i) for i in range(3)], max_answer_retries=2)
    with pytest.raises(AnswerRejected, match="not valid JSON"):
        policy.review_findings([], [])
    assert len(chat.seen) == 3  # the first answer and two retries, each sent back with the reason
    last = chat.seen[-1][-1]
    assert isinstance(last, ToolMessage) and str(last.content).startswith("rejected: the arguments of ReviewAnswer")


def test_reasoning_events_reach_a_graph_stream(ws: Workspace) -> None:
    """Inside a graph run, each LLM turn and each rejection is a ``reasoning`` progress event; the rule
    policy's decisions too. Outside a graph they go nowhere (no error)."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class S(TypedDict, total=False):
        out: str

    def node(_: S) -> S:
        policy, _chat = policy_for(ws, [edit_answer(search="no such line\n", call_id="c1"), edit_answer(call_id="c2")])
        policy.diagnose("run-1", exc_in_mod(), [])
        RulePolicy().diagnose("run-1", cuda_assert_in_mod(), [])
        return {"out": "done"}

    g: StateGraph[Any] = StateGraph(S)
    g.add_node("n", node)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    events = [c for mode, c in g.compile().stream({}, stream_mode=["custom"]) if mode == "custom"]
    said = [(e["agent"], e["source"], e["text"]) for e in events if e["kind"] == "reasoning"]
    assert said[0][:2] == ("debugger", "llm")
    assert said[0][2].startswith("answers DiagnosisAnswer: scale rejects its own")
    assert said[1][:2] == ("debugger", "llm") and said[1][2].startswith("npuport rejected the answer: ")
    assert said[2][:2] == ("debugger", "llm") and said[2][2].startswith("answers DiagnosisAnswer")
    assert said[3][:2] == ("debugger", "rules") and said[3][2].endswith("fix: device-agnostic")
    assert len(said) == 4 and all(e.get("prompt") for e in events[:3])
    RulePolicy().diagnose("run-1", cuda_assert_in_mod(), [])  # outside a graph: nothing to send, no error
