"""The transformers release a model's code runs with: the releases that provide everything the code reads
from transformers (agents/environment/api_needs.py), asked of each release's API index
(agents/environment/api_release.py), nearest config.json's release (a hint: when the hint's release lacks
something the code reads, the code wins and the note says why).

The search reads as few releases as it can (each is a wheel to download and index the first time): the
hint's line first; when it lacks some of the code's reads, the newest line (the host's) says which way they
lie: reads the newest line has came later (search upward), reads it lacks were removed (search downward).
Upward or downward, lines are tried at growing steps (1, 2, 4, ...) until one has them, then halved back to
the nearest that has (names come and stay, or stay and go); that line must then have every read, else the
next lines beyond it are tried, up to ``WALK`` more. A read no line provides at all (the hint, the newest and
the oldest all lack it: set at run time, or the model's own) does not decide the release and is listed; nor
does a member (an inherited call, a super() call) that only the hint's release and the newest were asked
about, when nothing else is missing: it waits for a run that fails on it (release_retry.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.environment.api_needs import Need
from agents.environment.api_release import Line, ReleaseAPI

WALK = 6
_MEMBER_READS = ("inherited call", "super()")


@dataclass
class Verdict:
    """One release examined: what of the code's reads it lacks (empty: it provides them all)."""

    release: str
    lacks: list[str]
    why: str = ""  # when a run rejected it: the error

    def shown(self) -> str:
        if self.why:
            return f"{self.release} failed at run time ({self.why})"
        more = f" and {len(self.lacks) - 2} more" if len(self.lacks) > 2 else ""
        if not self.lacks:
            return f"{self.release} has them all"
        return f"{self.release} lacks {', '.join(self.lacks[:2])}{more}"


@dataclass
class ReleaseChoice:
    hint: str  # the release config.json names (or the era it implies)
    chosen: str | None  # the release chosen (a version), None when no line provides every read
    needs: int  # how many reads of transformers the code makes
    tried: list[Verdict] = field(default_factory=list)  # every release examined, in order
    ignored: list[str] = field(default_factory=list)  # reads no release provides

    @property
    def chosen_line(self) -> Line | None:
        if self.chosen is None:
            return None
        major, minor = self.chosen.split(".")[:2]
        return int(major), int(minor)

    def as_dict(self) -> dict[str, object]:
        return {"hint": self.hint, "chosen": self.chosen, "needs": self.needs, "ignored": self.ignored,
                "tried": [{"release": v.release, "lacks": v.lacks, "why": v.why} for v in self.tried]}

    def rejected(self) -> list[Verdict]:
        return [v for v in self.tried if v.lacks or v.why]


class _Search:
    """The lines a choice may pick, each asked once."""

    def __init__(self, needs: list[Need], lines: dict[Line, str], api_of: Callable[[str], ReleaseAPI | None],
                 rejected: dict[Line, str]) -> None:
        self.needs, self.lines, self.api_of, self.rejected = needs, lines, api_of, rejected
        self.order = sorted(lines)
        self.seen: dict[Line, list[Need] | None] = {}
        self.tried: list[Verdict] = []

    def lacks(self, line: Line, needs: list[Need] | None = None) -> list[Need] | None:
        """The reads ``line`` lacks (of ``needs``, default all), None when its index cannot be had."""
        if line not in self.seen:
            api = self.api_of(self.lines[line])
            found = None if api is None else [n for n in self.needs if not any(api.provides(p) for p in n.paths)]
            if api is not None:
                api.save()
            self.seen[line] = found
            if found is not None or line in self.rejected:
                self.tried.append(Verdict(self.lines[line], [n.shown for n in found or []],
                                          self.rejected.get(line, "")))
        found = self.seen[line]
        if found is None:
            return None
        return [n for n in found if n in self.needs and (needs is None or n in needs)]

    def fits(self, line: Line, needs: list[Need] | None = None) -> bool:
        return line not in self.rejected and self.lacks(line, needs) == []

    def gallop(self, start: int, step: int, needs: list[Need]) -> int | None:
        """Index in ``order`` of the nearest line past ``start`` (in the direction of ``step``, +1 or -1) that
        provides ``needs``: steps of 1, 2, 4, ... until one does, then halved back (a line whose index cannot
        be had counts as lacking them)."""
        last = len(self.order) - 1
        near, jump, far = start, 1, None
        while far is None:
            i = min(last, max(0, start + step * jump))
            if i == near:
                return None  # the end of the lines, and none has them
            if self.lacks(self.order[i], needs) == []:
                far = i
            else:
                near, jump = i, jump * 2
        while abs(far - near) > 1:
            mid = (far + near) // 2
            if self.lacks(self.order[mid], needs) == []:
                far = mid
            else:
                near = mid
        return far

    def walk(self, found: int, step: int) -> Line | None:
        """From the nearest line that has the deciding reads, the first (at most ``WALK`` on) that has all."""
        for i in range(found, max(-1, min(len(self.order), found + step * (WALK + 1))), step):
            if self.fits(self.order[i]):
                return self.order[i]
        return None


def choose_release(needs: list[Need], hint: Line, lines: dict[Line, str],
                   api_of: Callable[[str], ReleaseAPI | None],
                   rejected: dict[Line, str] | None = None) -> ReleaseChoice:
    """The release nearest ``hint`` that provides every read in ``needs``, among ``lines`` (line -> its newest
    release), except the ``rejected`` lines (line -> why: a run failed there)."""
    rejected = rejected or {}
    if hint not in lines:
        hint = min(lines, key=lambda line: (abs(_rank(lines, line) - _rank(lines, hint)), -line[0], -line[1]))
    search = _Search(needs, lines, api_of, rejected)
    choice = ReleaseChoice(hint=lines[hint], chosen=None, needs=len(needs))
    if search.fits(hint):
        choice.chosen, choice.tried = lines[hint], search.tried
        return choice
    missing = search.lacks(hint) or []
    top = search.lacks(search.order[-1], missing)
    up = [n for n in missing if top is not None and n not in top]  # came after the hint: the newest has them
    down = [n for n in missing if n not in up]  # the newest lacks them too: removed since, look below
    if down and not up and not rejected and all(n.how in _MEMBER_READS for n in down):
        # members neither the hint's release nor the newest has (set at run time, or a path never run): nothing
        # says an older release has them, so they wait for a run that fails on one (release_retry.py)
        choice.chosen, choice.tried, choice.ignored = lines[hint], search.tried, [n.shown for n in down]
        return choice
    at = search.order.index(hint)
    primary = (1, up) if up else (-1, down) if down else (1, [])
    line = _nearest(search, at, [primary, (-primary[0], missing)])
    if line is None:
        # reads no release examined provides (set at run time, or the model's own) do not decide the release
        examined = [found for found in search.seen.values() if found is not None]
        gone = [n for n in search.needs if all(n in found for found in examined)]
        if gone:
            choice.ignored = [n.shown for n in gone]
            search.needs = [n for n in search.needs if n not in gone]
            line = hint if search.fits(hint) else _nearest(search, at, [primary, (-primary[0], missing)])
    choice.chosen = lines[line] if line is not None else None
    choice.tried = search.tried
    return choice


def _nearest(search: _Search, at: int, directions: list[tuple[int, list[Need]]]) -> Line | None:
    """The first direction's nearest line that has every read (``deciding`` reads found by galloping, the
    rest by walking on), else the next direction's."""
    for step, deciding in directions:
        first = search.gallop(at, step, deciding)
        line = search.walk(first, step) if first is not None else None
        if line is not None:
            return line
    return None


def _rank(lines: dict[Line, str], line: Line) -> int:
    return sorted({*lines, line}).index(line)


def choose_for_code(model_dir: Path, hint: Line, floor: Line, ceiling: Line | None = None,
                    log: Callable[[str], None] | None = None, rejected: dict[Line, str] | None = None,
                    extra: tuple[Need, ...] = ()) -> ReleaseChoice | None:
    """The release for the code in ``model_dir`` (``choose_release``) among one release per minor line from
    ``floor`` (the oldest installable here) to the host's (its own release stands for its line), below
    ``ceiling`` when the code breaks there; ``extra``: reads a run found missing. None when the code reads
    nothing of transformers or no release is known."""
    from agents.environment.api_needs import code_needs
    from agents.environment.api_release import (
        host_install,
        line_of,
        newest_of_lines,
        release_api,
        release_versions,
    )
    from knowledge.settings import settings

    log = log or (lambda _: None)
    needs = [*code_needs(model_dir), *extra]
    host = host_install()
    host_line = line_of(host[0]) if host else None
    if not needs or host is None or host_line is None:
        return None
    listed = [v.strip() for v in settings().transformers_releases.split(",") if v.strip()]
    if listed:
        lines = {line: v for v in listed if (line := line_of(v)) is not None}
    else:
        lines = newest_of_lines(release_versions(log), floor, host_line)
        lines[host_line] = host[0]
    if ceiling is not None:
        lines = {line: v for line, v in lines.items() if line < ceiling}
    if not lines:
        return None

    def api_of(version: str) -> ReleaseAPI | None:
        return release_api(version, log, installed=host[1] if version == host[0] else None)

    return choose_release(needs, hint, lines, api_of, rejected)


@dataclass
class RunRejections:
    """What runs taught about releases: the lines a run failed on with a missing name (line -> the error),
    and the reads those errors named (they join the code's own)."""

    rejected: dict[Line, str] = field(default_factory=dict)
    extra: tuple[Need, ...] = ()


def requirement_line(requirement: str) -> Line | None:
    """The line ``transformers~=4.23.0`` names, or the line below ``transformers<4.50``."""
    from agents.environment.api_release import line_of

    spec = requirement.removeprefix("transformers").strip()
    if spec.startswith("~="):
        return line_of(".".join(spec[2:].split(".")[:2]))
    if spec.startswith("<"):
        below = line_of(".".join(spec[1:].split(".")[:2]))
        return (below[0], below[1] - 1) if below and below[1] else None
    return None


def era_for_code(model_dir: Path, era: str | None, last: str, host_tf: str, floor: str | None,
                 runs: RunRejections | None = None, log: Callable[[str], None] | None = None,
                 saved: str | None = None) -> tuple[str | None, ReleaseChoice | None, str | None]:
    """(the era's requirement, the choice, a note) once the code's reads have had their say: ``era`` as it
    was when its release provides them all; else the nearest release that does (None: the host's, when that is
    the one); a 4.x era stays below ``last`` (the release from which the code breaks, or from which
    PreTrainedModel no longer gives generate)."""
    from agents.environment.api_release import line_of

    host_line = line_of(".".join(host_tf.split(".")[:2]))
    hint = requirement_line(era) if era else host_line
    if hint is None or host_line is None:
        return era, None, None
    floor_line = line_of(floor) if floor else None
    last_line = requirement_line(last)
    # an era of an older major release stays in it, and below ``last`` unless its hint is past that already
    ceiling = None
    if era and hint[0] < host_line[0]:
        ceiling = (last_line[0], last_line[1] + 1) if last_line and hint <= last_line else (hint[0] + 1, 0)
    runs = runs or RunRejections()
    choice = choose_for_code(model_dir, hint, floor_line or (hint[0], 0), ceiling, log, runs.rejected, runs.extra)
    if choice is None:
        return era, None, None
    if choice.chosen_line is None:
        kept = "the host's release"
        return era, choice, (f"no transformers release from {floor or 'the oldest'} to {host_tf} provides everything "
                             f"the code reads ({'; '.join(v.shown() for v in choice.rejected()[:3])}): "
                             f"{era or kept} is kept.")
    if choice.chosen_line == hint and not runs.rejected:
        note = (f"{len(choice.ignored)} read(s) of transformers that neither {choice.hint} nor the newest release "
                "examined provides do not decide the release (a member set at run time, or a path that never runs; "
                "a run that fails on one tries the next candidate): " + ", ".join(choice.ignored[:3])
                ) if choice.ignored else None
        return era, choice, note
    major, minor = choice.chosen_line[0], choice.chosen_line[1]
    chosen = None if choice.chosen_line == host_line else f"transformers~={major}.{minor}.0"
    told = (f"config.json's transformers {saved} (a hint; its era: {era})" if saved and era else
            f"the era {era}" if era else f"the host's transformers {host_tf}")
    why = "; ".join(v.shown() for v in choice.rejected()) or f"{choice.hint} is the nearest candidate to the hint"
    note = (f"the code's own reads of transformers decide its release over {told}: {why}. The code wins: "
            f"{choice.chosen} is the nearest release that provides all {choice.needs} of them.")
    return chosen, choice, note


def choice_text(resolution: dict[str, Any]) -> str | None:
    """One sentence for the report: the release the code's reads chose when it is not config.json's, the
    releases examined and why each was rejected (by the index, or by a run); None when the hint's stood."""
    choice = resolution.get("release_choice") or {}
    rejected = resolution.get("release_rejected") or {}
    if not choice.get("chosen") or (choice["chosen"] == choice.get("hint") and not rejected):
        return None
    tried = [Verdict(t["release"], t["lacks"], t.get("why", "")) for t in choice.get("tried") or []]
    why = [v.shown() for v in tried if v.lacks or v.why] + [f"{line} failed at run time ({e})" for line, e in
                                                           rejected.items()]
    return (f"transformers {choice['chosen']} chosen by what the code reads (config.json's release: "
            f"{choice.get('hint')}); rejected: {'; '.join(why)}")
