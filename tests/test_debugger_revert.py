"""The debugger keeps going when no recipe covers a failure: the traceback lands in a line npuport changed,
so that change is reverted at that site (a revert commit) and the port runs again, within the run budget.
The rule whose codemod is wrong is a test fixture (tests/fixtures/broken_rule.py) in a temporary registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.fixing.diagnosis import REVERT_FIX, npuport_change_at, revert_change
from agents.models import Frame, Patch, StructuredException
from agents.rules.registry import DEFAULT, use_registry
from agents.workspace import Workspace
from tests.fixtures import broken_rule

BROKEN_REGISTRY = DEFAULT.with_rules(broken_rule.RULE)

MANIFEST = """name: toy
entry:
  class: modeling_toy:ToyLM
config: config.json
inputs: modeling_toy:make_inputs
run:
  method: generate
  kwargs: {max_new_tokens: 4}
"""

MODEL = '''import torch
from torch import nn


class ToyLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 16)
        self.head = nn.Linear(16, config["vocab"])

    def forward(self, ids):
        h = torch.tanh(self.emb(ids))
        h = torch.sigmoid(h) * h
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


def _model(root: Path) -> Path:
    model = root / "toy"
    model.mkdir()
    (model / "npuport.yaml").write_text(MANIFEST)
    (model / "config.json").write_text(json.dumps({"vocab": 32}))
    (model / "modeling_toy.py").write_text(MODEL)
    return model


def test_a_failing_line_is_mapped_to_the_patch_and_only_that_site_is_reverted(tmp_path: Path) -> None:
    ws = Workspace.create(_model(tmp_path), tmp_path / "ws")
    path = ws.model_dir / "modeling_toy.py"
    # two patches: a good one (sigmoid line) and the broken one (tanh line)
    path.write_text(path.read_text().replace("torch.sigmoid(h) * h", "h * torch.sigmoid(h)"))
    good = ws.commit("npuport good")
    path.write_text(broken_rule.rename_tanh(path.read_text()).source)
    bad = ws.commit("npuport broken")
    patches = [Patch(id="patch-1", commit=good, summary="good", codemod="x"),
               Patch(id="patch-2", commit=bad, summary="bad", codemod="y")]
    exc = StructuredException(type="AttributeError", message="module 'torch' has no attribute 'tanh_npu'",
                              frames=[Frame(file="modeling_toy.py", line=12, in_model=True)])
    site = npuport_change_at(ws, exc, patches, set())
    assert site is not None and (site["patch_id"], site["file"], site["line"]) == ("patch-2", "modeling_toy.py", 12)
    assert npuport_change_at(ws, exc, patches, {(bad, "modeling_toy.py", 12)}) is None  # never the same site twice
    assert revert_change(ws, site) is not None
    text = path.read_text()
    assert "h = torch.tanh(self.emb(ids))" in text and "h * torch.sigmoid(h)" in text  # the good patch stays
    # a line no patch changed is not npuport's
    exc2 = exc.model_copy(update={"frames": [Frame(file="modeling_toy.py", line=8, in_model=True)]})
    assert npuport_change_at(ws, exc2, patches, set()) is None


@pytest.mark.slow
def test_the_debugger_reverts_a_wrong_fix_and_the_port_validates(tmp_path: Path, npuport_home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from graph.runner import run_port

    monkeypatch.setenv("NPUPORT_SANDBOX", "process")
    out = tmp_path / "bundle"
    with use_registry(BROKEN_REGISTRY):
        state = run_port({"request": {"model_path": str(_model(tmp_path)), "target": "cpu", "policy": "rule",
                                      "out_dir": str(out)}}, "broken-rule")
    assert state["status"] == "validated", state.get("reason")
    by_codemod = {p["codemod"]: p for p in state["patches"]}
    wrong, revert = by_codemod["toy-rename-tanh"], by_codemod[REVERT_FIX]
    (diag,) = [d for d in state["diagnoses"] if d["fix"] == REVERT_FIX]
    assert diag["params"]["commit"] == wrong["commit"] and diag["line"] == 12
    assert "no attribute 'tanh_npu'" in diag["summary"] and wrong["id"] in diag["summary"]
    assert revert["diagnosis_id"] == diag["id"] and revert["summary"].startswith(f"revert {wrong['id']}")
    # each attempt is a recorded sandbox run: the failing one, then the one after the revert
    port_runs = [r["ok"] for r in state["runs"] if r["id"].startswith("run-")]
    assert port_runs == [False, True]
    assert "tanh_npu" not in (out / "port.patch").read_text()
