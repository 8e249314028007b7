"""The hazard-rule registry (agents/rules/): every rule's findings are either fixed or manual with a
reason, the scanner's ``fixable`` is exactly what the rule policy fixes, one CUDA-only table, and a toy
rule from one file (tests/fixtures/toy_rule.py) is scanned, fixed and explained end to end."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from agents.fixing.codemods import CODEMODS
from agents.models import Frame, HazardCategory, Severity, StructuredException
from agents.policies.rule import RulePolicy
from agents.reading.scanner import scan_source, scan_tree
from agents.rules.base import Registry
from agents.rules.diagnose import classify
from agents.rules.registry import DEFAULT, active, use_registry
from knowledge.errors import UnknownFindingRule
from tests.fixtures import toy_rule

ROOT = Path(__file__).resolve().parents[1]


def _every_finding_rule(reg: Registry) -> list[tuple[str, str]]:
    return [(r.hazard, rule) for r in reg.rules for rule in sorted(r.finding_rules())]


@pytest.mark.parametrize(("hazard", "rule"), _every_finding_rule(DEFAULT))
def test_fixable_is_exactly_what_the_rule_policy_fixes(hazard: str, rule: str) -> None:
    r = DEFAULT.get(hazard)
    assert r is not None
    in_fix = [f.codemod for f in r.fixes if rule in f.rules]
    assert len(in_fix) <= 1 and (bool(in_fix) != (rule in r.manual)), "fixed XOR manual"
    if rule in r.manual:
        assert len(r.manual[rule]) > 20, "a manual finding says why"
    f = DEFAULT.finding(hazard, rule, "m.py", 3, 0, "", "msg", HazardCategory.BLOCKS_RUNNING, Severity.HIGH)
    actions = RulePolicy().plan_fixes([f])
    assert f.fixable == bool(in_fix) == bool(actions)
    if actions:
        (a,) = actions
        assert a.codemod == in_fix[0] and a.finding_ids == [f.id] and a.codemod in CODEMODS


@pytest.mark.parametrize("example", ["ocr_mini", "tiny_llm"])
def test_planned_findings_are_the_fixable_ones_on_the_examples(example: str) -> None:
    findings = scan_tree(ROOT / "examples" / example).findings
    planned = {fid for a in RulePolicy().plan_fixes(findings) for fid in a.finding_ids}
    assert planned == {f.id for f in findings if f.fixable}
    assert planned and planned != {f.id for f in findings}  # both kinds occur


def test_a_detector_may_lower_fixable_but_not_raise_it() -> None:
    # cupy is CUDA-only but not one the import guard handles: reported, not fixable, not planned
    src = "import cupy\nimport flash_attn\n\ncupy.zeros(1)\nflash_attn.f(1)\n"
    by_line = {f.line: f for f in scan_source(src, "m.py") if f.rule == "cuda-only-import"}
    assert not by_line[1].fixable and by_line[2].fixable
    planned = {fid for a in RulePolicy().plan_fixes(list(by_line.values())) for fid in a.finding_ids}
    assert planned == {by_line[2].id}


def test_rules_name_their_recipe_topic_and_fixtures() -> None:
    for r in DEFAULT.rules:
        assert r.topic == f"recipe:{r.hazard}" and (ROOT / r.recipe).is_file(), r.hazard
        front = (ROOT / r.recipe).read_text().split("---")[1]
        assert re.search(rf"^id: {r.hazard}$", front, re.M)
        assert r.fixtures and all((ROOT / p).exists() for p in r.fixtures), r.hazard
        assert r.left_as_written or r.hazard in ("H1", "H2", "H9"), r.hazard
    numbers = [int(r.hazard.removeprefix("H")) for r in DEFAULT.rules]
    assert numbers[:17] == list(range(1, 18)) and numbers == sorted(set(numbers))  # one rule per number, in order


def test_an_undeclared_finding_rule_is_an_error() -> None:
    with pytest.raises(UnknownFindingRule):
        DEFAULT.finding("H1", "no-such-rule", "m.py", 1, 0, "", "m", HazardCategory.BLOCKS_RUNNING, Severity.LOW)


def test_error_patterns_name_their_rule_fix_and_citation() -> None:
    def diag(type_: str, message: str) -> tuple[str, str | None, list[str]]:
        exc = StructuredException(type=type_, message=message, frames=[Frame(file="m.py", line=7, in_model=True)])
        d = RulePolicy().diagnose("run-1", exc, [])
        return d.kind, d.fix, [c.source for c in d.citations]

    assert diag("ModuleNotFoundError", "No module named 'flash_attn'") == \
        ("missing-cuda-module", "guard-cuda-only-imports", ["recipe:H3"])
    assert diag("ModuleNotFoundError", "No module named 'cupyx'")[:2] == ("missing-module", None)
    assert diag("AssertionError", "Torch not compiled with CUDA enabled") == \
        ("cuda-assert", "device-agnostic", ["recipe:H1"])
    assert diag("RuntimeError", "Expected all tensors to be on the same device, but found cpu and npu:0") == \
        ("device-mismatch", "align-devices", ["recipe:H11"])
    assert diag("RuntimeError", "EZ1001: ... not implemented for DT_DOUBLE") == \
        ("npu-dtype", "float64-to-float32", ["recipe:H5"])
    assert diag("RuntimeError", "EZ1001: ... not implemented for DT_INT16") == ("npu-dtype", None, [])


def test_one_cuda_only_table() -> None:
    """The scanner, the import guard, the debugger and the reference run's stubs read
    sandbox/cuda_redirect/cuda_only.py; no other module spells the list out again."""
    import sandbox.cuda_redirect.redirect
    from agents.rules.h3_cuda_libraries import GuardCudaOnlyImports
    from sandbox.cuda_redirect.cuda_only import CUDA_ONLY_ROOTS, STUB_ROOTS

    assert sandbox.cuda_redirect.redirect.CUDA_ONLY_MODULES is STUB_ROOTS and CUDA_ONLY_ROOTS <= STUB_ROOTS
    assert GuardCudaOnlyImports({}).modules is CUDA_ONLY_ROOTS
    spelled = [p for pkg in ("agents", "sandbox", "knowledge", "graph", "api") for p in (ROOT / pkg).rglob("*.py")
               if re.search(r"[\"']flash_attn_2_cuda[\"']", p.read_text(encoding="utf-8"))]
    assert [p.relative_to(ROOT).as_posix() for p in spelled] == ["sandbox/cuda_redirect/cuda_only.py"]


def test_product_modules_stay_under_500_lines() -> None:
    files = [p for pkg in ("agents", "graph", "knowledge", "sandbox", "api") for p in (ROOT / pkg).rglob("*.py")]
    assert len(files) > 100  # the walk itself works
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


# ----------------------------------------------------------------------------------------------
# A toy rule from one file, in a temporary registry
# ----------------------------------------------------------------------------------------------

TOY_REGISTRY = DEFAULT.with_rules(toy_rule.RULE)


def test_the_toy_rule_lives_only_in_its_temporary_registry() -> None:
    src = "def f(h):\n    return toy_sync(h)\n"
    assert [f.hazard for f in scan_source(src, "m.py")] == ["H24"]  # the name nothing binds (hazard H24)
    with use_registry(TOY_REGISTRY):
        (f,) = [f for f in scan_source(src, "m.py") if f.hazard != "H24"]
        assert (f.hazard, f.rule, f.line, f.fixable) == ("H90", "toy-sync-call", 2, True)
        assert f.citations[0].source == "recipe:H90"
        (a,) = RulePolicy().plan_fixes([f])
        assert a.codemod == "toy-drop-sync" and CODEMODS["toy-drop-sync"][1] == "H90"
        assert CODEMODS[a.codemod][0](src).source == "def f(h):\n    return h\n"
        exc = StructuredException(type="RuntimeError", message="... device type at start of device string: toyaccel")
        assert classify(exc).kind == "toy-device"
    assert active() is DEFAULT and "toy-drop-sync" not in CODEMODS


TOY_MANIFEST = """name: toy
entry:
  class: modeling_toy:ToyLM
config: config.json
inputs: modeling_toy:make_inputs
run:
  method: generate
  kwargs: {max_new_tokens: 4}
"""

# ACCEL is "cuda" on a CUDA host (and in the reference run, under the cuda -> cpu redirect); once the
# device fix makes the code device-agnostic, elsewhere it is the toy accelerator, and `.to(ACCEL)` fails.
TOY_MODEL = '''import torch
from torch import nn

ACCEL = "cuda" if torch.cuda.is_available() else "toyaccel"


def toy_sync(t):
    return t


class ToyLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 16)
        self.head = nn.Linear(16, config["vocab"])

    def forward(self, ids):
        h = toy_sync(self.emb(ids))
        h = h.to(ACCEL)
        return self.head(h)

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
        ids = input_ids
        out = []
        for _ in range(max_new_tokens):
            nxt = self.forward(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            out.append(nxt)
        return torch.cat(out, dim=1)


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab"], (1, 5), generator=g)}
'''


@pytest.mark.slow
def test_a_toy_rule_is_scanned_fixed_and_explained_through_the_graph(tmp_path: Path, npuport_home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    model = tmp_path / "toy"
    model.mkdir()
    (model / "npuport.yaml").write_text(TOY_MANIFEST)
    (model / "config.json").write_text(json.dumps({"vocab": 32}))
    (model / "modeling_toy.py").write_text(TOY_MODEL)
    out = tmp_path / "bundle"
    with use_registry(TOY_REGISTRY):
        state = run_port({"request": {"model_path": str(model), "target": "cpu", "policy": "rule",
                                      "out_dir": str(out)}}, "toy-rule")
    assert state["status"] == "validated", state.get("reason")
    # scanned
    toy = [f for f in state["findings"] if f["hazard"] == "H90"]
    assert [(f["rule"], f["line"], f["fixable"]) for f in toy] == [("toy-sync-call", 18, True)]
    # explained by the debugger: its error pattern matched the port's run-time error, at the line it names
    (diag,) = [d for d in state["diagnoses"] if d["kind"] == "toy-device"]
    assert diag["fix"] == "toy-drop-device-move" and diag["file"] == "modeling_toy.py"
    assert [c["source"] for c in diag["citations"]][0] == "recipe:H90"
    # fixed by the patcher: one commit for the static finding, one after the diagnosis
    by_codemod = {p["codemod"]: p for p in state["patches"]}
    assert by_codemod["toy-drop-sync"]["finding_ids"] == [toy[0]["id"]]
    assert by_codemod["toy-drop-device-move"]["diagnosis_id"] == diag["id"]
    patch = (out / "port.patch").read_text()
    assert "-        h = toy_sync(self.emb(ids))" in patch and "+        h = self.emb(ids)" in patch
    assert "-        h = h.to(ACCEL)" in patch and "+        h = h\n" in patch
    moved = by_codemod["toy-drop-device-move"]
    assert moved["summary"].startswith("H90 toy-drop-device-move") and len(moved["commit"]) == 40
    assert state["numerics"]["verdict"] == "match"
    assert state["counters"]["port_runs"] == 2  # the toy error, then the fixed run
    assert "toy_sync(self.emb(ids))" in (model / "modeling_toy.py").read_text()  # the original is untouched
    report = (out / "report.md").read_text()
    assert "toy-drop-sync" in report


def test_the_toy_model_reads_as_described() -> None:
    """Keeps the line numbers the end-to-end test asserts honest."""
    lines = TOY_MODEL.splitlines()
    assert lines[17].strip() == "h = toy_sync(self.emb(ids))" and lines[18].strip() == "h = h.to(ACCEL)"
    assert textwrap.dedent(TOY_MODEL) == TOY_MODEL
