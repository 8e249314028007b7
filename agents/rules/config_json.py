"""config.json values as findings and in-place rewrites, shared by the rules that read a model's config
(H1's CUDA device, H4's FlashAttention selection): one finding per dotted key, on the key's line; a rewrite
that changes only those values and leaves the rest of the text as written (port.patch shows one line each)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from agents.models import Finding, HazardCategory, Severity
from agents.rules.context import TextFile
from agents.rules.kit import CodemodResult

Hits = Callable[[dict[str, Any]], Iterable[tuple[str, str]]]  # config -> (dotted key, value) pairs


def value_findings(tf: TextFile, hits: Hits, hazard: str, rule: str, message: Callable[[str, str], str],
                   category: HazardCategory, severity: Severity) -> list[Finding]:
    """A finding for each (dotted key, value) ``hits`` picks out of a model config, on the key's line."""
    config = tf.config_object()
    if config is None:
        return []
    lines = tf.text.splitlines()
    out = []
    for key, value in hits(config):
        line = json_key_line(tf.text, key)
        snippet = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        out.append(tf.finding(hazard, rule, line, 0, snippet, message(key, value), category, severity))
    return out


def rewrite_values(source: str, hits: Hits, new: str, why: str) -> CodemodResult:
    """Each value ``hits`` picks out of the JSON text -> ``new``, in place; ``why`` ends each edit line."""
    try:
        config = json.loads(source)
    except ValueError:
        return CodemodResult(source, False, skipped=["line 1: not a JSON object"])
    if not isinstance(config, dict):
        return CodemodResult(source, False)
    lines = source.splitlines(keepends=True)
    edits, spans = [], []
    for key, value in hits(config):
        line = json_key_line(source, key)
        if not 0 < line <= len(lines):
            continue
        leaf = re.escape(json.dumps(key.rsplit(".", 1)[-1]))
        pattern = re.compile(rf"({leaf}\s*:\s*)\"{re.escape(value)}\"")
        changed, n = pattern.subn(lambda m: f'{m.group(1)}"{new}"', lines[line - 1], count=1)
        if n:
            lines[line - 1] = changed
            edits.append(f"line {line}: {key}: \"{value}\" -> \"{new}\" ({why})")
            spans.append((line, line))
    text = "".join(lines)
    return CodemodResult(text, text != source, edits=edits, spans=spans)


_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_JSON_COLON = re.compile(r"\s*:")


def json_key_line(text: str, path: str) -> int:
    """The line of the key at dotted path ("language_config.n_routed_experts") in JSON text; 1 if not found."""
    stack: list[str] = []  # the key path of each open object or array ("" for the top level)
    last = ""  # the last key read in the innermost open object
    i, line = 0, 1
    while i < len(text):
        c = text[i]
        if c == '"':
            m = _JSON_STRING.match(text, i)
            if m is None:
                return 1
            i = m.end()
            if _JSON_COLON.match(text, i):  # a key
                last = json.loads(m.group(0))
                full = f"{stack[-1]}.{last}" if stack and stack[-1] else last
                if full == path:
                    return line
            continue
        if c == "\n":
            line += 1
        elif c in "{[":
            parent = stack[-1] if stack else ""
            stack.append((f"{parent}.{last}" if parent else last) if last else parent)
            last = ""
        elif c in "}]":
            if stack:
                stack.pop()
            last = ""
        i += 1
    return 1
