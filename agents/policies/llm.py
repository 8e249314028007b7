"""The LLM policy, and the hybrid policy that escalates to it when no recipe helps.

The LLM (``langchain_openai.ChatOpenAI`` against any OpenAI-compatible endpoint) decides; our code
acts. Each question is one conversation: a system prompt from ``agents/prompts/<agent>.md``, the
facts, and tools (read_file, grep, search_kb, run_in_sandbox) that our code executes with bounded
output. The answer is a pydantic record, offered to the model as one more tool (so it can answer in
the same turn as it reads), with ``with_structured_output`` as the fallback when it stops calling
tools. Every answer is validated before it is accepted, and an invalid one goes back to the model
with the reason: codemods must exist and change something, edits must stay in the workspace, apply
cleanly and leave code that parses. Usage is counted from the responses against a token budget
per port; when it is spent the policy stops and says so.

LLM edits reach the patcher as the codemod ``llm-edit`` (registered in ``agents.codemods``) with
params ``{"edits": [{"file", "search", "replace"}, ...]}``; unified diffs are turned into the same
search/replace blocks (agents/llm_edits.py applies and validates them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel, ValidationError

from agents.llm_edits import (  # noqa: F401  (re-exported: agents.codemods registers llm_edit_codemod from here)
    EditResult,
    LLMEdit,
    SearchReplace,
    _strip_line_numbers,
    apply_blocks,
    apply_llm_edit,
    diff_to_edits,
    llm_edit_codemod,
)
from agents.llm_settings import LLMSettings
from agents.models import Citation, Diagnosis, Finding, StructuredException
from agents.policies.base import FixAction, PolicyContext
from agents.policies.fence import FENCE_NOTE, fence
from agents.policies.llm_answers import (  # noqa: F401  (re-exported)
    DiagnosisAnswer,
    FixPlan,
    FixProposal,
    GoalAnswer,
    PlannedFix,
    ReviewAnswer,
    ReviewedFinding,
    TokenBudget,
    TrialsAnswer,
    tokens_of,
)
from agents.policies.reasoning import llm_turn_text, think, why_failed
from agents.policies.rule import RulePolicy
from agents.policies.tools import ToolBox, ToolError, resolve_in
from agents.rules.diagnose import classify
from agents.rules.registry import active
from agents.rules.registry import active as active_rules
from knowledge.errors import AnswerRejected, BudgetExhausted, LLMEditError, first_line  # noqa: F401  (re-exported)
from sandbox.targets import CHIP_REGISTRY, TARGETS

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage


PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"
LLM_EDIT = "llm-edit"
_META_PARAMS = ("by", "llm_tokens", "rationale", "budget_exhausted", "prompt_id")  # diagnosis params that are not codemod params
A = TypeVar("A", bound=BaseModel)


def _targets_text() -> str:
    return ", ".join(f'"{n}" ({s.summary})' for n, s in TARGETS.items())


def _chips_text() -> str:
    return ", ".join(f'"{c.key}" ({c.product}{"; also " + ", ".join(c.aliases) if c.aliases else ""})'
                     for c in CHIP_REGISTRY.values())


# Where a prompt lists a registry's entries it says {name}; the list is rendered from the registry in
# force (agents/rules/registry.py, sandbox/targets/registry.py), never written out in the prompt.
PROMPT_LISTS: dict[str, Callable[[], str]] = {
    "{hazard_classes}": lambda: active_rules().catalogue(),
    "{targets}": _targets_text,
    "{chips}": _chips_text,
}


def load_prompt(agent: str) -> str:
    """The system prompt of an agent: agents/prompts/<agent>.md, with the registries' lists where it
    names them (``PROMPT_LISTS``)."""
    path = PROMPTS_DIR / f"{agent}.md"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt for agent {agent!r} at {path}")
    text = path.read_text(encoding="utf-8")
    for marker, render in PROMPT_LISTS.items():
        if marker in text:
            text = text.replace(marker, render())
    return text


# -------------------------------------------------------------------------------------------- policy


def _codemod_catalogue() -> dict[str, tuple[str, str]]:
    from agents.codemods import CODEMODS

    return {name: (hazard, desc) for name, (_fn, hazard, desc) in CODEMODS.items() if name != LLM_EDIT}


def _catalogue_text() -> str:
    return "\n".join(f"- {n} ({h}): {d}" for n, (h, d) in _codemod_catalogue().items())


def _exception_text(exc: StructuredException) -> str:
    frames = "\n".join(f"  {'[model] ' if f.in_model else ''}{f.file}:{f.line} in {f.func}: {f.code}" for f in exc.frames[-12:])
    return fence(f"{exc.type}: {exc.message[:2000]}\nframes (innermost last):\n{frames or '  (none)'}", "exception")


class LLMPolicy:
    """Decides with an LLM. ``chat_model`` (any langchain chat model with tool calling) replaces the
    ChatOpenAI built from the settings; ``context`` attaches the port's workspace to the tools."""

    name = "llm"

    def __init__(self, settings: LLMSettings | None = None, chat_model: BaseChatModel | None = None,
                 context: PolicyContext | None = None, toolbox: ToolBox | None = None) -> None:
        self.settings = settings or LLMSettings()
        self.context = context or PolicyContext()
        self._chat = chat_model
        model_dir = self.context.model_dir
        self.toolbox = toolbox or ToolBox(
            model_dir=model_dir if model_dir and model_dir.is_dir() else None,
            scratch_dir=self.context.workdir / "llm_scratch" if self.context.workdir else None,
            max_chars=self.settings.tool_output_chars, sandbox_timeout_s=self.settings.sandbox_timeout_s,
            max_sandbox_calls=self.settings.max_sandbox_calls)
        ledger = self.context.workdir / "llm_usage.json" if self.context.workdir else None
        self.budget = TokenBudget(self.settings.port_token_limit, ledger)
        self.records: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.last_prompt_id: str | None = None
        self._agent = "llm"
        self._answer_name: str | None = None

    # ----------------------------------------------------------------------------- plumbing

    def chat_model(self) -> BaseChatModel:
        if self._chat is None:
            s = self.settings
            if not s.configured:
                raise RuntimeError("no LLM is configured: set NPUPORT_LLM_BASE_URL and NPUPORT_LLM_MODEL")
            from langchain_openai import ChatOpenAI

            key = s.api_key.get_secret_value() if s.api_key else "not-needed"  # local servers ignore it
            self._chat = ChatOpenAI(model=s.model or "", base_url=s.base_url, api_key=key,  # type: ignore[arg-type]
                                    temperature=s.temperature, timeout=s.timeout_s, max_retries=s.max_retries,
                                    max_completion_tokens=s.max_completion_tokens, stream_usage=True)
        return self._chat

    def _invoke(self, runnable: Any, messages: list[BaseMessage]) -> AIMessage:
        self.budget.check()
        try:
            ai = runnable.invoke(messages)
        except Exception as exc:
            self._record(messages, None, 0, error=f"{type(exc).__name__}: {first_line(exc, 300)}")
            think(self._agent, "llm", f"the LLM call failed: {why_failed(exc)}", prompt=self.last_prompt_id)
            raise
        tokens = tokens_of(ai, messages)
        self.budget.add(tokens)
        self._record(messages, ai, tokens)
        self._think_turn(ai, tokens)
        return ai

    def _think_turn(self, ai: AIMessage, tokens: int) -> None:
        """The turn as live progress (the chat API and the job stream show it)."""
        reasoning = (ai.additional_kwargs or {}).get("reasoning_content")  # reasoning models behind vLLM and others
        calls: list[dict[str, Any]] = [{"name": c["name"], "args": c["args"]} for c in ai.tool_calls]
        calls += [{"name": c.get("name"), "args": {"invalid arguments": str(c.get("args"))[:120]}}
                  for c in ai.invalid_tool_calls]
        think(self._agent, "llm", llm_turn_text(ai.content, calls, self._answer_name, reasoning),
              prompt=self.last_prompt_id, tokens=tokens)

    @property
    def records_dir(self) -> Path | None:
        """Where every prompt and response of this port is saved (the bundle copies it as llm/)."""
        return self.context.workdir / "llm" if self.context.workdir and self.context.workdir.is_dir() else None

    def _record(self, sent: Sequence[BaseMessage], ai: AIMessage | None, tokens: int, error: str | None = None) -> None:
        """Save one exchange (secrets scrubbed) as llm/<n>-<agent>.json; its stem is the prompt id that
        commits and diagnoses cite. Without a workspace (the planner) the exchange is kept in memory."""
        n = len(self.records) + 1
        folder = self.records_dir
        if folder is not None:
            folder.mkdir(exist_ok=True)
            n = len(list(folder.glob("*.json"))) + 1
        pid = f"{n:03d}-{self._agent}"
        usage = dict(ai.usage_metadata or {}) if ai is not None else {}
        rec = {"id": pid, "agent": self._agent, "model": self.settings.model, "tokens": tokens, "usage": usage,
               "budget": {"used": self.budget.used, "limit": self.budget.limit}, "error": error,
               "messages": [_scrub(_message_dict(m), self._secrets()) for m in sent],
               "response": _scrub(_message_dict(ai), self._secrets()) if ai is not None else None}
        self.records.append(rec)
        self.last_prompt_id = pid
        if folder is not None:
            (folder / f"{pid}.json").write_text(json.dumps(rec, indent=1, default=str), encoding="utf-8")

    def _secrets(self) -> list[str]:
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        return [key] if len(key) >= 4 else []

    def ask(self, agent: str, question: str, schema: type[A],
            validate: Callable[[A], list[str]] | None = None, tools: bool = True) -> A:
        """One conversation: tools until the model answers with ``schema``; invalid answers go back
        with the reasons. Raises BudgetExhausted or AnswerRejected."""
        from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

        self._agent = agent
        self._answer_name = schema.__name__
        model = self.chat_model()
        check = validate or (lambda _a: [])
        messages: list[BaseMessage] = [SystemMessage(load_prompt(agent)), HumanMessage(question)]
        answer_name = schema.__name__
        rejected = 0
        problems: list[str] = []
        if tools:
            bound = model.bind_tools([*self.toolbox.openai_tools(), schema])
            for _ in range(self.settings.max_tool_rounds):
                ai = self._invoke(bound, messages)
                messages.append(ai)
                if not ai.tool_calls and not ai.invalid_tool_calls:
                    break
                for bad in ai.invalid_tool_calls:
                    why = f"the arguments of {bad.get('name')} are not valid JSON"
                    if bad.get("name") == answer_name:  # a malformed answer counts against the retries
                        rejected += 1
                        problems = [why]
                        messages.append(ToolMessage(_rejection(problems), tool_call_id=bad.get("id") or ""))
                        think(agent, "llm", f"npuport rejected the answer: {why}", prompt=self.last_prompt_id)
                        continue
                    messages.append(ToolMessage(f"error: {why}", tool_call_id=bad.get("id") or ""))
                for call in ai.tool_calls:
                    if call["name"] != answer_name:
                        messages.append(ToolMessage(self.toolbox.run(call["name"], call["args"]),
                                                    tool_call_id=call["id"] or ""))
                        continue
                    answer, problems = _parse(schema, call["args"], check)
                    if answer is not None:
                        return answer
                    rejected += 1
                    messages.append(ToolMessage(_rejection(problems), tool_call_id=call["id"] or ""))
                    think(agent, "llm", f"npuport rejected the answer: {'; '.join(problems)}", prompt=self.last_prompt_id)
                if rejected > self.settings.max_answer_retries:
                    raise AnswerRejected("; ".join(problems))
        # The model stopped calling tools (or used up its rounds): ask for the structured answer.
        structured = model.with_structured_output(schema, method=self.settings.structured_method, include_raw=True)
        messages.append(HumanMessage(f"Give your answer now as {answer_name}."))
        for _ in range(self.settings.max_answer_retries + 1):
            self.budget.check()
            try:
                out = cast(dict[str, Any], structured.invoke(messages))  # include_raw: raw, parsed, parsing_error
            except Exception as exc:
                self._record(messages, None, 0, error=f"{type(exc).__name__}: {first_line(exc, 300)}")
                think(self._agent, "llm", f"the LLM call failed: {why_failed(exc)}", prompt=self.last_prompt_id)
                raise
            raw = out["raw"]
            tokens = tokens_of(raw, messages)
            self.budget.add(tokens)
            self._record(messages, raw, tokens)
            self._think_turn(raw, tokens)
            parsed = out.get("parsed")
            if parsed is not None:
                answer, problems = _parse(schema, parsed.model_dump() if isinstance(parsed, BaseModel) else parsed, check)
                if answer is not None:
                    return answer
            elif raw.invalid_tool_calls:
                bad = raw.invalid_tool_calls[0]
                problems = [f"the arguments of {bad.get('name')} are not valid JSON "
                            f"({str(bad.get('error') or '')[:200] or 'cannot parse'})"]
            else:
                problems = [f"the answer does not match {answer_name}: {str(out.get('parsing_error'))[:300]}"]
            messages.append(raw)
            think(agent, "llm", f"npuport rejected the answer: {'; '.join(problems)}", prompt=self.last_prompt_id)
            if raw.tool_calls:
                messages.extend(ToolMessage(_rejection(problems), tool_call_id=c["id"] or "") for c in raw.tool_calls)
            else:
                messages.append(HumanMessage(_rejection(problems)))
        raise AnswerRejected("; ".join(problems))

    # ----------------------------------------------------------------------------- validation

    def _check_fix(self, fix: FixProposal | PlannedFix, fallback_file: str | None = None) -> list[str]:
        catalogue = _codemod_catalogue()
        if fix.codemod:
            if fix.codemod not in catalogue:
                return [f"unknown codemod {fix.codemod!r}; choose from {', '.join(catalogue)} or give an edit"]
            file = getattr(fix, "file", None) or fallback_file
            if isinstance(fix, FixProposal):
                if not file:
                    return [f"name the file that {fix.codemod} rewrites"]
                return self._dry_run_codemod(fix.codemod, file, fix.codemod_params)
            return []
        edit = LLMEdit(edits=fix.edits, diff=fix.diff)
        if not edit.edits and not edit.diff:
            return ["the fix names neither a codemod nor an edit"]
        model_dir = self.toolbox.model_dir
        if model_dir is None:
            try:  # no workspace to check against: the patcher validates when it applies the edit
                edit.blocks()
            except LLMEditError as exc:
                return [str(exc)]
            return []
        return apply_llm_edit(model_dir, edit, write=False).errors

    def _dry_run_codemod(self, codemod: str, file: str, params: dict[str, Any]) -> list[str]:
        from agents.codemods import CODEMODS

        model_dir = self.toolbox.model_dir
        if model_dir is None:
            return []
        try:
            path = resolve_in(model_dir, file)
            result = CODEMODS[codemod][0](path.read_text(encoding="utf-8"), **params)
        except (ToolError, OSError, TypeError, ValueError) as exc:
            return [f"{codemod} on {file}: {exc}"]
        except Exception as exc:  # noqa: BLE001 - a codemod's own failure (e.g. a parse error) goes back to the model
            return [f"{codemod} cannot rewrite {file}: {type(exc).__name__}: {first_line(exc, 200)}"]
        return [] if result.changed else [f"{codemod} changes nothing in {file}; propose an edit instead"]

    # ----------------------------------------------------------------------------- Policy protocol

    def plan_fixes(self, findings: list[Finding], fallback: bool = True) -> list[FixAction]:
        """Patches before the first run. When the LLM cannot answer (budget, service, answers rejected
        past the retries), the rule plan (``fallback``) or none; ``notes`` says which and why."""
        if not findings:
            return []
        known = {f.id: f for f in findings}

        def check(plan: FixPlan) -> list[str]:
            problems = []
            for i, fx in enumerate(plan.fixes, 1):
                unknown = [fid for fid in fx.finding_ids if fid not in known]
                if unknown:
                    problems.append(f"fix {i}: unknown finding ids {unknown}")
                if fx.codemod and not fx.finding_ids:
                    problems.append(f"fix {i}: a codemod fix must name the findings it fixes")
                problems += [f"fix {i}: {p}" for p in self._check_fix(fx)]
            return problems

        table = "\n".join(f"- {f.id}: {f.hazard}/{f.rule} at {f.file}:{f.line} [{f.category}, {f.severity}, "
                          f"{'codemod exists' if f.fixable else 'no codemod'}] {f.message} | {f.snippet[:120]}"
                          for f in findings)
        question = (f"Findings of the static scan:\n{table}\n\nCodemods:\n{_catalogue_text()}\n\n"
                    "Plan the patches to make before the first run.")
        try:
            plan = self.ask("patcher", question, FixPlan, check)
        except Exception as exc:  # noqa: BLE001 - budget, service or answers: the offline plan still ports known hazards
            what = "the rule plan is used" if fallback else "the findings stay unpatched"
            note = f"the LLM patcher gave no usable plan ({why_failed(exc)}); {what}"
            self.notes.append(note)
            think("patcher", "rules", note)
            return RulePolicy().plan_fixes(findings) if fallback else []
        self.notes.append(f"the LLM patcher planned {len(plan.fixes)} fix(es) (prompt {self.last_prompt_id})")
        actions = []
        for fx in plan.fixes:
            hits = [known[i] for i in fx.finding_ids]
            cites = list({c.source: c for f in hits for c in f.citations}.values()) or [
                Citation(source=f"recipe:{h}") for h in sorted({f.hazard for f in hits})]
            if fx.codemod:
                files = sorted({f.file for f in hits})
                actions.append(FixAction(codemod=fx.codemod, files=files, finding_ids=fx.finding_ids,
                                         summary=fx.summary or f"{fx.codemod}: {len(hits)} finding(s)", citations=cites))
            else:
                blocks = LLMEdit(edits=fx.edits, diff=fx.diff).blocks()
                actions.append(FixAction(codemod=LLM_EDIT, files=sorted({b.file for b in blocks}),
                                         params={"edits": [b.model_dump() for b in blocks]}, finding_ids=fx.finding_ids,
                                         summary=(fx.summary or "LLM edit") + f" [prompt llm/{self.last_prompt_id}.json]",
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
        earlier = "\n".join(f"- {d.id}: {d.signature}: {d.summary} (fix: {d.fix}"
                            + (f", edits {json.dumps(d.params.get('edits'))[:600]}" if d.params.get("edits") else "")
                            + ")" for d in history[-6:]) or "none"
        question = (f"Run {run_id} of the port failed.\n{FENCE_NOTE}\n\n{_exception_text(exception)}\n\n"
                    f"npuport's classifier: {sig.kind} ({sig.key}): {sig.summary}\n"
                    + (f"The offline rules say: {rule_reading.summary}\n" if rule_reading else "")
                    + f"\nEarlier diagnoses of this port:\n{earlier}\n\n"
                    + self._changed_lines() + self._kb_passages(exception)
                    + f"Codemods:\n{_catalogue_text()}\n\n"
                    "Find the cause in the model's files and propose a fix; cite passages by their id.")
        start = self.budget.used

        def check(ans: DiagnosisAnswer) -> list[str]:
            return self._check_fix(ans.fix, ans.file or base.file) if ans.fix else []

        try:
            ans = self.ask("debugger", question, DiagnosisAnswer, check)
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

    def _changed_lines(self, limit: int = 4000) -> str:
        """What npuport changed so far (git diff from the original), so the model sees its own edits."""
        if self.context.workdir is None:
            return ""
        from agents.workspace import Workspace

        try:
            diff = Workspace(self.context.workdir).diff_from_original()
        except Exception:  # noqa: BLE001 - no repository yet: nothing changed
            return ""
        if not diff.strip():
            return "Changes npuport made so far: none\n\n"
        cut = "\n... (diff truncated)" if len(diff) > limit else ""
        return f"Changes npuport made so far (git diff from the original):\n{diff[:limit]}{cut}\n\n"

    def _kb_passages(self, exception: StructuredException) -> str:
        """The knowledge base's top passages for the exception, each with its id to cite."""
        from agents.citations import kb_citations

        try:
            hits = kb_citations(f"{exception.type}: {exception.message[:300]}", k=3)
        except Exception:  # noqa: BLE001 - no usable knowledge base: the search_kb tool says so
            hits = []
        if not hits:
            return ""
        body = "\n".join(f"- [{c.source}] {c.title}: {c.excerpt}" for c in hits)
        return f"Knowledge-base passages (cite by the id in brackets):\n{body}\n\n"

    def _diagnosis_from(self, base: Diagnosis, ans: DiagnosisAnswer, tokens: int) -> Diagnosis:
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

    # ----------------------------------------------------------------------------- other agents

    def understand_goal(self, goal: str) -> dict[str, Any]:
        """planner: the request fields a goal text asks for (only those it states). A model path must
        appear in the goal, so the model cannot invent one."""
        def check(ans: GoalAnswer) -> list[str]:
            if ans.model_path and ans.model_path not in goal:
                return [f"{ans.model_path!r} is not in the goal; copy the path exactly or give null"]
            return []

        ans = self.ask("planner", f"Goal: {goal}", GoalAnswer, check, tools=False)
        out = ans.model_dump(exclude_none=True)
        if not out.get("constraints"):
            out.pop("constraints", None)
        return out

    def review_findings(self, findings: list[Finding], sites: list[dict[str, Any]] | None = None) -> list[Finding]:
        """code_reader: hazards the static scan missed, each checked to point at a real line. ``sites``:
        CUDA-looking lines no rule classified, with their code context."""
        model_dir = self.toolbox.model_dir
        if model_dir is None:
            return []
        seen = {(f.file, f.line, f.hazard) for f in findings}
        hazards = active_rules().hazards()

        def check(ans: ReviewAnswer) -> list[str]:
            problems = []
            for rf in ans.findings:
                if rf.hazard not in hazards:
                    problems.append(f"{rf.hazard!r} is not a hazard class; choose one of {', '.join(hazards)}")
                try:
                    lines = resolve_in(model_dir, rf.file).read_text(encoding="utf-8").splitlines()
                except (ToolError, OSError) as exc:
                    problems.append(f"{rf.file}: {exc}")
                    continue
                if not 1 <= rf.line <= len(lines):
                    problems.append(f"{rf.file} has no line {rf.line}")
            return problems

        table = "\n".join(f"- {f.hazard}/{f.rule} at {f.file}:{f.line}: {f.message}" for f in findings) or "none"
        unclassified = "\n\n".join(f"{x['file']}:{x['line']}: {x['code']}\n{x['context']}" for x in sites or [])
        question = (f"The static scan found:\n{table}\n\n"
                    + (f"Lines that look CUDA-specific but that no rule classified (custom extensions, kernels, "
                       f"device logic), with context:\n{unclassified}\n\n" if unclassified else "")
                    + "Review the model for what it missed: give each hazard its file:line and class.")
        ans = self.ask("code_reader", question, ReviewAnswer, check)
        out = []
        for rf in ans.findings:
            if (rf.file, rf.line, rf.hazard) in seen:
                continue
            seen.add((rf.file, rf.line, rf.hazard))
            snippet = resolve_in(model_dir, rf.file).read_text(encoding="utf-8").splitlines()[rf.line - 1].strip()
            out.append(Finding(id=f"{rf.hazard}-{rf.file}-{rf.line}-llm-{rf.rule}", hazard=rf.hazard,
                               rule=f"llm-{rf.rule}", file=rf.file, line=rf.line, snippet=snippet[:200],
                               message=rf.message, category=rf.category, severity=rf.severity, fixable=False,
                               citations=[Citation(source=f"recipe:{rf.hazard}")]))
        return out

    def suggest_trials(self, space: dict[str, list[Any]], tried: list[dict[str, Any]], objective: str,
                       n: int = 4) -> list[dict[str, Any]]:
        """tuner: up to ``n`` untried configurations, every value taken from the search space."""
        def check(ans: TrialsAnswer) -> list[str]:
            problems = []
            for i, t in enumerate(ans.trials, 1):
                for k, v in t.items():
                    if k not in space:
                        problems.append(f"trial {i}: {k!r} is not a parameter; parameters: {', '.join(space)}")
                    elif v not in space[k]:
                        problems.append(f"trial {i}: {k}={v!r} is not one of {space[k]}")
            return problems

        done = "\n".join(f"- {json.dumps(t, default=str)}" for t in tried) or "none"
        ans = self.ask("tuner", f"Objective: {objective}\nSearch space: {json.dumps(space, default=str)}\n"
                                f"Tried so far:\n{done}\n\nPropose up to {n} configurations to try next.",
                       TrialsAnswer, check, tools=False)
        fresh: list[dict[str, Any]] = []
        for t in ans.trials:
            if t not in tried and t not in fresh:
                fresh.append(t)
        return fresh[:n]


_SECRET_PATTERNS = (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
                    re.compile(r"(?i)\b(api[_-]?key|token|secret|password)(\s*[=:]\s*)['\"]?[^\s'\",]{4,}"))


def _scrub(data: Any, secrets: list[str]) -> Any:
    """The record with secrets replaced: the configured key, and key-looking strings (sk-..., bearer
    tokens, key=... assignments) the model may have read from a file."""
    if isinstance(data, dict):
        return {k: _scrub(v, secrets) for k, v in data.items()}
    if isinstance(data, list):
        return [_scrub(v, secrets) for v in data]
    if isinstance(data, str):
        for s in secrets:
            data = data.replace(s, "[scrubbed]")
        for pat in _SECRET_PATTERNS:
            data = pat.sub(lambda m: (m.group(1) + m.group(2) + "[scrubbed]") if m.lastindex else "[scrubbed]", data)
        return data
    return data


def _message_dict(m: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.type, "content": m.content}
    calls = getattr(m, "tool_calls", None)
    if calls:
        out["tool_calls"] = [{"name": c["name"], "args": c["args"], "id": c.get("id")} for c in calls]
    if getattr(m, "tool_call_id", None):
        out["tool_call_id"] = m.tool_call_id  # type: ignore[attr-defined]
    return out


def _parse(schema: type[A], args: Any, check: Callable[[A], list[str]]) -> tuple[A | None, list[str]]:
    try:
        answer = schema.model_validate(args)
    except ValidationError as exc:
        return None, [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5]]
    try:
        problems = check(answer)
    except LLMEditError as exc:
        problems = [str(exc)]
    return (answer, []) if not problems else (None, problems)


def _rejection(problems: list[str]) -> str:
    return "rejected: " + "; ".join(problems) + ". Fix these and answer again."


class HybridPolicy:
    """Rules first; the LLM when the rules have no fix for a failure or the same failure came back
    after its fix (the debugger's loop detection). Static plans stay with the rules."""

    name = "hybrid"

    def __init__(self, settings: LLMSettings | None = None, chat_model: BaseChatModel | None = None,
                 context: PolicyContext | None = None, toolbox: ToolBox | None = None) -> None:
        self.rule = RulePolicy()
        self.settings = settings or LLMSettings()
        self.llm = LLMPolicy(self.settings, chat_model, context, toolbox)
        self.llm_available = chat_model is not None or self.settings.configured
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
