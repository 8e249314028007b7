"""The LLM policy: the patcher's plan and the debugger's diagnosis from the LLM, asked through the one
door (``agents.llm.client.LLMClient``) with the roles' questions and checks (agents/llm/roles/).

When the LLM gives nothing usable (budget spent, service down, answers rejected past the retries) the
rule policy decides and ``notes`` says why, so a port never stops on the LLM. LLM edits reach the
patcher as the codemod ``llm-edit`` (agents/fixing/codemods.py) with params ``{"edits": [{"file",
"search", "replace"}, ...]}``; unified diffs become the same blocks (agents/fixing/llm_edits.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.fixing.codemods import LLM_EDIT
from agents.fixing.llm_edits import LLMEdit
from agents.llm.client import LLMClient, TokenBudget
from agents.llm.roles import code_reader, debugger, patcher, planner, tuner
from agents.llm.tools import ToolBox
from agents.models import Citation, Diagnosis, Finding, FixAction, StructuredException
from agents.policies.base import PolicyContext
from agents.policies.rule import RulePolicy
from agents.reasoning import think, why_failed
from agents.rules.diagnose import classify
from agents.rules.registry import active
from knowledge.errors import BudgetExhausted
from knowledge.settings import LLMSettings

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

# diagnosis params that are not codemod params
_META_PARAMS = ("by", "llm_tokens", "rationale", "budget_exhausted", "prompt_id")


class LLMPolicy:
    """Decides with an LLM. ``chat_model`` (any langchain chat model with tool calling) replaces the
    ChatOpenAI built from the settings; ``context`` attaches the port's workspace to the tools."""

    name = "llm"

    def __init__(self, settings: LLMSettings | None = None, chat_model: BaseChatModel | None = None,
                 context: PolicyContext | None = None, toolbox: ToolBox | None = None) -> None:
        self.context = context or PolicyContext()
        self.client = LLMClient(settings, chat_model, self.context.workdir, toolbox)
        self.notes: list[str] = []

    # the client's state, read by the nodes, the bundle and the tests
    @property
    def settings(self) -> LLMSettings:
        return self.client.settings

    @property
    def budget(self) -> TokenBudget:
        return self.client.budget

    @property
    def records(self) -> list[dict[str, Any]]:
        return self.client.records

    @property
    def last_prompt_id(self) -> str | None:
        return self.client.last_prompt_id

    @property
    def toolbox(self) -> ToolBox:
        return self.client.toolbox

    @property
    def records_dir(self) -> Path | None:
        return self.client.records_dir

    def chat_model(self) -> BaseChatModel:
        return self.client.chat_model()

    # ----------------------------------------------------------------------------- Policy protocol

    def plan_fixes(self, findings: list[Finding], fallback: bool = True) -> list[FixAction]:
        """Patches before the first run. When the LLM cannot answer (budget, service, answers rejected
        past the retries), the rule plan (``fallback``) or none; ``notes`` says which and why."""
        if not findings:
            return []
        try:
            plan = patcher.plan(self.client, findings)
        except Exception as exc:  # noqa: BLE001 - budget, service or answers: the offline plan still ports known hazards
            what = "the rule plan is used" if fallback else "the findings stay unpatched"
            note = f"the LLM patcher gave no usable plan ({why_failed(exc)}); {what}"
            self.notes.append(note)
            think("patcher", "rules", note)
            return RulePolicy().plan_fixes(findings) if fallback else []
        self.notes.append(f"the LLM patcher planned {len(plan.fixes)} fix(es) (prompt {self.last_prompt_id})")
        known = {f.id: f for f in findings}
        actions = []
        for fx in plan.fixes:
            hits = [known[i] for i in fx.finding_ids]
            cites = list({c.source: c for f in hits for c in f.citations}.values()) or [
                Citation(source=f"recipe:{h}") for h in sorted({f.hazard for f in hits})]
            if fx.codemod:
                files = sorted({f.file for f in hits})
                actions.append(FixAction(codemod=fx.codemod, files=files, finding_ids=fx.finding_ids,
                                         params=active().plan_params(fx.codemod, findings),
                                         summary=fx.summary or f"{fx.codemod}: {len(hits)} finding(s)",
                                         citations=cites))
            else:
                blocks = LLMEdit(edits=fx.edits, diff=fx.diff).blocks()
                actions.append(FixAction(codemod=LLM_EDIT, files=sorted({b.file for b in blocks}),
                                         params={"edits": [b.model_dump() for b in blocks]}, finding_ids=fx.finding_ids,
                                         summary=(fx.summary or "LLM edit")
                                         + f" [prompt llm/{self.last_prompt_id}.json]",
                                         citations=cites))
        return actions

    def diagnose(self, run_id: str, exception: StructuredException, history: list[Diagnosis],
                 rule_reading: Diagnosis | None = None) -> Diagnosis:
        sig = classify(exception)
        frame = sig.frame
        base = Diagnosis(id=f"diag-{len(history) + 1}", run_id=run_id, signature=sig.key, kind=sig.kind,
                         summary=sig.summary, file=frame.file if frame else None, line=frame.line if frame else None,
                         params={"by": "llm"})
        tries = [d for d in history if d.signature == sig.key and d.params.get("by") == "llm" and d.fix]
        if len(tries) >= self.settings.max_fix_attempts:
            base.summary = (f"{sig.summary}; the same failure came back after {len(tries)} LLM fix(es), "
                            "so the LLM makes no progress on it")
            return base
        start = self.budget.used
        try:
            ans = debugger.diagnose(self.client, run_id, exception, history, base,
                                    rule_reading.summary if rule_reading else None)
        except Exception as exc:  # noqa: BLE001 - a spent budget, a timeout, an unreachable service or unusable answers
            return self._rule_fallback(run_id, exception, history, base, rule_reading, exc, self.budget.used - start)
        return self._diagnosis_from(base, ans, self.budget.used - start)

    def _rule_fallback(self, run_id: str, exception: StructuredException, history: list[Diagnosis], base: Diagnosis,
                       rule_reading: Diagnosis | None, exc: Exception, tokens: int) -> Diagnosis:
        """The LLM debugger gave nothing: the rule policy's diagnosis decides (its recipe, when one covers
        the failure), and the summary says that the LLM failed and why. Never a crash."""
        spent = isinstance(exc, BudgetExhausted)
        why = f"{exc}, so the LLM policy stops" if spent else f"the LLM gave no usable fix ({why_failed(exc)})"
        reading = rule_reading or RulePolicy().diagnose(run_id, exception, history)
        if reading.fix:
            note = f"{why}; the rules decided: {reading.fix}"
            diag = reading.model_copy(update={"summary": f"{reading.summary} ({note})"})
        else:
            note = f"{why}; the rules have no fix either"
            diag = base.model_copy(update={"summary": f"{base.summary}; {why}", "citations": reading.citations})
            diag.params = {"by": "llm", "llm_tokens": tokens, **({"budget_exhausted": True} if spent else {})}
        self.notes.append(note)
        think("debugger", "rules", f"{diag.summary}; fix: {diag.fix or 'none'}")
        return diag

    def _diagnosis_from(self, base: Diagnosis, ans: debugger.DiagnosisAnswer, tokens: int) -> Diagnosis:
        params: dict[str, Any] = {"by": "llm", "llm_tokens": tokens, "prompt_id": self.last_prompt_id}
        fix: str | None = None
        file = ans.file or base.file
        fx = ans.fix
        if fx and fx.codemod:
            fix, file = fx.codemod, fx.file or file
            params.update(fx.codemod_params)
        elif fx:
            fix = LLM_EDIT
            blocks = LLMEdit(edits=fx.edits, diff=fx.diff).blocks()
            params["edits"] = [b.model_dump() for b in blocks]
            file = blocks[0].file
        self.notes.append(f"the LLM diagnosed {ans.kind or base.kind} and proposed "
                          f"{fix or 'no fix'} (prompt {self.last_prompt_id}, {tokens} tokens)")
        return base.model_copy(update={
            "kind": ans.kind or base.kind, "summary": ans.summary or base.summary, "file": file,
            "line": ans.line if ans.line is not None else base.line, "fix": fix, "params": params,
            "citations": [Citation(source=c) for c in ans.citations]})

    def fix_for(self, diagnosis: Diagnosis) -> FixAction | None:
        if not diagnosis.fix:
            return None
        params = {k: v for k, v in diagnosis.params.items() if k not in _META_PARAMS}
        if diagnosis.fix == LLM_EDIT:
            files = sorted({e["file"] for e in params.get("edits") or []})
        else:
            files = [diagnosis.file] if diagnosis.file else []
        if not files:
            return None
        pid = diagnosis.params.get("prompt_id")
        return FixAction(codemod=diagnosis.fix, files=files, params=params, diagnosis_id=diagnosis.id,
                         summary=f"{diagnosis.fix}: {diagnosis.summary}" + (f" [prompt llm/{pid}.json]" if pid else ""),
                         citations=diagnosis.citations)

    # ----------------------------------------------------------------------------- the other roles

    def understand_goal(self, goal: str) -> dict[str, Any]:
        return planner.understand_goal(self.client, goal)

    def review_findings(self, findings: list[Finding], sites: list[dict[str, Any]] | None = None) -> list[Finding]:
        return code_reader.review_findings(self.client, findings, sites)

    def suggest_trials(self, space: dict[str, list[Any]], tried: list[dict[str, Any]], objective: str,
                       n: int = 4) -> list[dict[str, Any]]:
        return tuner.suggest_trials(self.client, space, tried, objective, n)
