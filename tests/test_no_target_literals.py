"""Capabilities, not names: outside the target registry (sandbox/targets/) no module compares a target
or chip name, spells a chip's name, or builds a target by name; the code asks TargetSpec and Chip
(emulated, counts_ops, needs_device, compile_backend, npu_like, dtypes, bf16) or uses the registry's
defaults (DEFAULT_CHIP, REFERENCE_TARGET, ...). And the request is read as a PortRequest: no
``req.get(`` / ``request.get(`` outside agents/request.py.

Both checks read the source (AST), so a new target or chip is one module plus one registry line and
nothing else has to learn its name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sandbox.targets import CHIP_REGISTRY, TARGETS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agents", "api", "graph", "knowledge", "sandbox")
# Where names may be spelt, and why.
EXEMPT = {
    "sandbox/targets/": "the registry itself: one module per target, the chip records",
    "sandbox/ascend_sim/": "the emulated target's own runtime (its chip profiles are keyed by chip, beside the target)",
    "knowledge/kb/aclnn.py": "parses CANN's documentation, whose tables name chips in their own words",
}
CHIP_WORDS = {n for c in CHIP_REGISTRY.values() for n in (c.key, *c.aliases)}
TARGET_WORDS = set(TARGETS)
# Words that are target names AND ordinary device strings ("cpu", "npu") or settings ("auto"): only a
# comparison with something called target/chip, or a Target built from them, counts.
AMBIGUOUS = {"cpu", "npu", "auto"}
TARGETISH = re.compile(r"target|chip|\.name\b|\[['\"]name['\"]\]|get\(['\"]name['\"]")


def _files() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel.startswith(e) for e in EXEMPT):
                out.append(path)
    return out


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value.lower()}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {v for e in node.elts for v in _strings(e)}
    return set()


def _offences(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    rel = path.relative_to(ROOT).as_posix()
    out = []

    def bad(node: ast.AST, why: str) -> None:
        out.append(f"{rel}:{getattr(node, 'lineno', '?')}: {why}: {ast.unparse(node)[:160]}")

    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            word = node.value.lower()
            if word in CHIP_WORDS or (word in TARGET_WORDS and word not in AMBIGUOUS):
                bad(node, f"names {word!r}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = {w for s in sides for w in _strings(s)} & (TARGET_WORDS | CHIP_WORDS)
            others = " ".join(ast.unparse(s) for s in sides if not _strings(s))
            if named & AMBIGUOUS and TARGETISH.search(others):
                bad(node, "compares a target name")
        elif isinstance(node, ast.Call):
            fn = ast.unparse(node.func)
            if (fn.split(".")[-1] in ("Target", "resolve_target") and node.args
                    and _strings(node.args[0]) & TARGET_WORDS):
                bad(node, "builds a target by name")
        elif (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)  # `t.get("name") or "cpu"`
              and any(_strings(v) & AMBIGUOUS for v in node.values) and TARGETISH.search(ast.unparse(node))):
            bad(node, "defaults a target by name")
    return out


def test_no_target_or_chip_name_outside_the_registry() -> None:
    offences = [o for path in _files() for o in _offences(path)]
    assert offences == [], "ask TargetSpec / Chip or use the registry's defaults instead:\n" + "\n".join(offences)


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    """The scan is not vacuous: each forbidden form is reported, a device string alone is not."""
    sample = tmp_path / "agents" / "x.py"
    sample.parent.mkdir(parents=True)
    sample.write_text('def f(target, req, t):\n'
                      '    a = target == "ascend-sim"\n'
                      '    b = req.chip in ("310p",)\n'
                      '    c = t.get("name") or "cpu"\n'
                      '    d = Target("cpu", "cpu")\n'
                      '    e = torch.device("cpu")\n'
                      '    g = target.name != "npu"\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _offences(sample)
    finally:
        ROOT = saved
    lines = sorted({int(o.split(":")[1]) for o in found})
    assert lines == [2, 3, 4, 5, 7], found


REQUEST_GET = re.compile(r"\b(req|request)\.get\(")


def test_the_request_is_read_typed_outside_its_module() -> None:
    offences = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == "agents/request.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if REQUEST_GET.search(line.split("#")[0]):  # code, not a comment
                offences.append(f"{rel}:{i}: {line.strip()}")
    assert offences == [], "read the request as a PortRequest (agents.request.request_of):\n" + "\n".join(offences)
