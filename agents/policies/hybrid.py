"""The hybrid policy: rules first; the LLM when the rules have no fix for a failure or the same failure
came back after its fix (the debugger's loop detection). Static plans stay with the rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.fixing.codemods import LLM_EDIT
from agents.llm.tools import ToolBox
from agents.models import Diagnosis, Finding, FixAction, StructuredException
from agents.policies.base import PolicyContext
from agents.policies.llm import LLMPolicy
from agents.policies.rule import RulePolicy
from agents.rules.registry import active
from knowledge.settings import LLMSettings

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel


class HybridPolicy:
    """Rules first, the LLM where they have nothing."""

    name = "hybrid"

    def __init__(self, settings: LLMSettings | None = None, chat_model: BaseChatModel | None = None,
                 context: PolicyContext | None = None, toolbox: ToolBox | None = None) -> None:
        self.rule = RulePolicy()
        self.llm = LLMPolicy(settings, chat_model, context, toolbox)
        self.settings = self.llm.settings
        self.llm_available = self.llm.client.available
        self.notes: list[str] = []

    def plan_fixes(self, findings: list[Finding]) -> list[FixAction]:
        """The rules' plan; with an LLM, findings no codemod covers go to the LLM patcher, whose edits
        are validated (apply exactly, parse) before they are planned."""
        actions = self.rule.plan_fixes(findings)
        covered = {fid for a in actions for fid in a.finding_ids}
        rules = active()
        left = [f for f in findings if f.id not in covered and not f.fixable
                and not ((r := rules.get(f.hazard)) is not None and r.reports_only(f.rule))]
        if not left or not self.llm_available:
            return actions
        extra = self.llm.plan_fixes(left, fallback=False)
        self.notes = self.llm.notes
        return actions + [a for a in extra if a.codemod == LLM_EDIT or not set(a.finding_ids) & covered]

    def diagnose(self, run_id: str, exception: StructuredException, history: list[Diagnosis]) -> Diagnosis:
        reading = self.rule.diagnose(run_id, exception, history)
        if reading.fix:
            return reading
        if not self.llm_available:
            return reading.model_copy(update={"summary": f"{reading.summary}; no LLM is configured to escalate to "
                                                         "(set NPUPORT_LLM_BASE_URL and NPUPORT_LLM_MODEL)"})
        diag = self.llm.diagnose(run_id, exception, history, rule_reading=reading)
        self.notes = self.llm.notes
        return diag

    def fix_for(self, diagnosis: Diagnosis) -> FixAction | None:
        if diagnosis.params.get("by") == "llm":
            return self.llm.fix_for(diagnosis)
        return self.rule.fix_for(diagnosis)
