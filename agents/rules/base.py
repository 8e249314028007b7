"""What a hazard rule is (one module per hazard class, see docs/rules.md) and the registry that lists them.

A rule holds everything npuport knows about one class of hazard: how the scanner finds it (detectors),
how it is fixed (codemods, or "manual" with the reason), which run-time errors it explains (the
debugger's patterns), where the knowledge base covers it and which fixtures exercise it. The scanner,
the rule policy, the debugger and the report all read the rules through a ``Registry``, so a finding's
``fixable`` flag is, by construction, "the rule policy has a codemod for it".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.models import Citation, Finding, Frame, HazardCategory, Severity, StructuredException
from knowledge.errors import UnknownFindingRule

_PROJECT_ROOT = Path(__file__).resolve().parents[2]  # holds knowledge/recipes/

if TYPE_CHECKING:
    from agents.rules.context import ModuleContext, TextFile
    from agents.rules.kit import CodemodResult


@dataclass(frozen=True)
class Signature:
    """A failure signature: a pure function of the exception, so the same failure twice reads the same."""

    kind: str
    key: str  # the signature string: kind plus what identifies this failure
    summary: str
    frame: Frame | None
    # What the class read from the exception for its fix (``params``: the codemod's parameters; ``no_fix``: why
    # the class fits but cannot fix this one; ``action``: a fix that is not a codemod, e.g. "rebuild-inputs")
    details: Mapping[str, Any] = field(default_factory=dict, compare=False)


def at_where(where: str) -> str:
    """"at file:line", or "outside the model's files" (an error pattern's ``where`` when no frame is the model's)."""
    return f"at {where}" if ":" in where else "outside the model's files"


@dataclass(frozen=True)
class Fix:
    """A codemod that fixes some of a rule's findings (``rules``, the finding rule ids) before the first
    run; with ``rules`` empty it is applied only after the debugger diagnoses a failure."""

    codemod: str  # the name the patcher, the report and the commit message use
    apply: Callable[..., CodemodResult]  # source text (+ params) -> CodemodResult
    description: str
    rules: frozenset[str] = frozenset()
    order: int = 100  # position in the static plan: imports first, so later codemods parse what will run
    # codemod parameters chosen from all the model's findings (a choice that spans files), None: no parameters
    plan_params: Callable[[list[Finding]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class ErrorPattern:
    """A run-time error the rule explains: ``match`` turns a structured exception into a signature
    (None when it is not this error); the diagnosis then names ``fix`` and cites the rule's topic."""

    kind: str
    match: Callable[[StructuredException, Frame | None, str], Signature | None]  # (exc, frame, "file:line")
    title: str  # the citation's title
    fix: str | None = None  # a codemod name (one of some rule's fixes), None: explained but not fixed
    needs_frame: bool = True  # the fix (and citation) apply only when the error points into the model
    fix_if: Callable[[Signature], bool] | None = None  # extra condition on the signature
    params: Callable[[Signature], dict[str, Any]] | None = None  # codemod parameters (e.g. the line)
    order: int = 100  # patterns are tried in this order, before the debugger's generic ones


@dataclass(frozen=True)
class HazardRule:
    """One hazard class. ``detect`` reads a parsed Python module; ``detect_text`` reads requirement,
    README and shell lines. Every finding rule id a detector emits is either fixed (in one of
    ``fixes``) or listed in ``manual`` with the reason it is left to a person."""

    hazard: str  # "H1", "H2", ...; the number orders the report
    title: str
    detect: Callable[[ModuleContext], None] | None = None
    detect_text: Callable[[TextFile], list[Finding]] | None = None
    fixes: tuple[Fix, ...] = ()
    manual: Mapping[str, str] = field(default_factory=dict)  # finding rule id -> why no codemod
    explains: tuple[ErrorPattern, ...] = ()
    kb_topic: str = ""  # the knowledge-base topic cited by findings, e.g. "recipe:H1"
    left_as_written: str = ""  # the report's reason when a finding of this class stays as written
    fixtures: tuple[str, ...] = ()  # tests / fixtures that exercise the rule
    # Findings are information for the person (e.g. sizes fixed in code, for --shrink), never a patch: not
    # even the LLM patcher is asked to change them.
    report_only: bool = False
    report_only_rules: frozenset[str] = frozenset()  # the same for these finding rule ids only
    # A pass over the whole tree's findings with every Python source (rel path -> text), for what one file
    # cannot tell (H3: a module the model imports under try/except ImportError keeps its imports).
    refine: Callable[[list[Finding], Mapping[str, str]], list[Finding]] | None = None

    def reports_only(self, rule: str) -> bool:
        """Whether findings of this rule id are information for the person, never a patch."""
        return self.report_only or rule in self.report_only_rules

    @property
    def topic(self) -> str:
        return self.kb_topic or f"recipe:{self.hazard}"

    @property
    def recipe(self) -> str:
        """The recipe behind the class (``knowledge/recipes/<hazard>.md``, relative to the project root), ""
        when the class has none (a toy rule)."""
        rel = f"knowledge/recipes/{self.hazard}.md"
        return rel if (_PROJECT_ROOT / rel).is_file() else ""

    def finding_rules(self) -> frozenset[str]:
        return frozenset().union(*(f.rules for f in self.fixes)) | frozenset(self.manual)

    def codemod_for(self, rule: str) -> str | None:
        return next((f.codemod for f in self.fixes if rule in f.rules), None)


class Registry:
    """The hazard rules in force. ``agents.rules.registry`` holds the default one; tests pass their own."""

    def __init__(self, rules: Iterable[HazardRule]) -> None:
        self.rules: tuple[HazardRule, ...] = tuple(rules)
        self._by_hazard = {r.hazard: r for r in self.rules}
        if len(self._by_hazard) != len(self.rules):
            raise ValueError("two rules share a hazard id")
        names = {f.codemod for r in self.rules for f in r.fixes}
        for r in self.rules:
            for p in r.explains:
                if p.fix is not None and p.fix not in names:
                    raise ValueError(f"{r.hazard}: pattern {p.kind} names unknown codemod {p.fix}")

    def with_rules(self, *extra: HazardRule) -> Registry:
        return Registry([*self.rules, *extra])

    def get(self, hazard: str) -> HazardRule | None:
        return self._by_hazard.get(hazard)

    def title(self, hazard: str) -> str:
        r = self.get(hazard)
        return r.title if r else hazard

    # --- the hazard classes, for every list that names them (prompts, LLM answer checks, help) -----
    def hazards(self) -> tuple[str, ...]:
        """The hazard ids, in registry order ("H1", "H2", ...)."""
        return tuple(r.hazard for r in self.rules)

    def span(self) -> str:
        """The ids as a range for prose ("H1-H17"; one id alone when there is one)."""
        ids = self.hazards()
        return ids[0] if len(ids) == 1 else f"{ids[0]}-{ids[-1]}" if ids else "none"

    def catalogue(self) -> str:
        """One line per hazard class, id and title: the list the LLM prompts show."""
        return "\n".join(f"- {r.hazard} {r.title}" for r in self.rules)

    # --- fixes --------------------------------------------------------------------------------
    def codemod_for(self, hazard: str, rule: str) -> str | None:
        """The codemod the rule policy applies to a finding (hazard, rule id) before the first run."""
        r = self.get(hazard)
        return r.codemod_for(rule) if r else None

    def plan_params(self, codemod: str, findings: list[Finding]) -> dict[str, Any]:
        """The parameters a static codemod takes for this model (Fix.plan_params over all its findings)."""
        fix = next((f for r in self.rules for f in r.fixes if f.codemod == codemod), None)
        return fix.plan_params(findings) if fix is not None and fix.plan_params is not None else {}

    def codemods(self) -> dict[str, tuple[Callable[..., CodemodResult], str, str]]:
        """codemod name -> (function, hazard of the first rule declaring it, description)."""
        out: dict[str, tuple[Callable[..., CodemodResult], str, str]] = {}
        pairs = sorted(((r, f) for r in self.rules for f in r.fixes), key=lambda rf: rf[1].order)
        for r, f in pairs:
            out.setdefault(f.codemod, (f.apply, r.hazard, f.description))
        return out

    def static_plan(self) -> list[tuple[str, dict[str, frozenset[str]]]]:
        """[(codemod, {hazard: finding rule ids it fixes})] in plan order (a codemod may serve several rules)."""
        order: dict[str, int] = {}
        covers: dict[str, dict[str, frozenset[str]]] = {}
        for r in self.rules:
            for f in r.fixes:
                if not f.rules:
                    continue
                order[f.codemod] = min(order.get(f.codemod, f.order), f.order)
                by_hazard = covers.setdefault(f.codemod, {})
                by_hazard[r.hazard] = by_hazard.get(r.hazard, frozenset()) | f.rules
        return [(name, covers[name]) for name in sorted(order, key=lambda n: order[n])]

    # --- findings -----------------------------------------------------------------------------
    def finding(self, hazard: str, rule: str, file: str, line: int, col: int, snippet: str, message: str,
                category: HazardCategory, severity: Severity, fixable: bool = True) -> Finding:
        """A finding; ``fixable`` says whether the detector allows the fix here (e.g. the import guard
        knows only some libraries); the result is fixable only when the rule also has a codemod for it."""
        r = self.get(hazard)
        if r is None or rule not in r.finding_rules():
            raise UnknownFindingRule(f"{hazard}/{rule}: declare it in the rule's fixes or manual table")
        return Finding(id=f"{hazard}-{rule}-{file}:{line}", hazard=hazard, rule=rule, file=file, line=line, col=col,
                       snippet=snippet, message=message, category=category, severity=severity,
                       fixable=fixable and r.codemod_for(rule) is not None,
                       citations=[Citation(source=r.topic, title=r.title)])

    # --- run-time errors ----------------------------------------------------------------------
    def patterns(self) -> list[tuple[HazardRule, ErrorPattern]]:
        pairs = [(r, p) for r in self.rules for p in r.explains]
        return sorted(pairs, key=lambda rp: rp[1].order)  # stable: registry order among equals

    def pattern(self, kind: str) -> tuple[HazardRule, ErrorPattern] | None:
        return next(((r, p) for r, p in self.patterns() if p.kind == kind), None)


# Short names the detectors use.
BLOCKS = HazardCategory.BLOCKS_RUNNING
NUMBERS = HazardCategory.CHANGES_NUMBERS
SLOWS = HazardCategory.SLOWS_DOWN
HIGH, MEDIUM, LOW = Severity.HIGH, Severity.MEDIUM, Severity.LOW
