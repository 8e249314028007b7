"""CI's slice of the zoo (../shared/data/zoo: public remote-code releases, code and configs only): six
releases ported through the batch mode with --shrink and the rule policy (no LLM) on ascend-sim, the
way bench/zoo.py ports the whole zoo. Chosen to cover the classes of issue 25:

- the environment of the model's era (config.json's transformers_version, another major release than the
  host's): stable-code-3b (generate without GenerationMixin, a `_tied_weights_keys` list, `pad_token_id`
  read from the config), internlm2-chat-7b (`rope_scaling["type"]`), falcon-7b-instruct (`get_head_mask`),
  phi-1_5-mixformer, internlm-20b;
- TorchScript's legacy executor switched on (H15 legacy-jit-fuser, rewritten), generation settings read
  from the model config (`config.max_length`) and a tokenizer dependency (sentencepiece): chatglm2-6b.

Each must validate, in a layered env of its era that the report names, with its version couplings listed
as H18 findings (file:line), and the zoo's folders must be left as they were."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SLICE = ("stable-code-3b", "internlm2-chat-7b", "falcon-7b-instruct", "phi-1_5-mixformer", "internlm-20b",
         "chatglm2-6b")


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.slow
def test_a_slice_of_the_zoo_validates_in_the_environment_of_its_era(shared_data: Path, tmp_path: Path) -> None:
    zoo = shared_data / "zoo"
    if not all((zoo / n / "config.json").is_file() for n in SLICE):
        pytest.skip(f"the zoo at {zoo} lacks one of {', '.join(SLICE)}")
    before = {n: _digest(zoo / n) for n in SLICE}
    manifest = tmp_path / "zoo.yaml"
    manifest.write_text(yaml.safe_dump({
        "name": "zoo-slice",
        "defaults": {"target": "ascend-sim", "shrink": True, "policy": "rule", "timeout_s": 600,
                     "budget": {"max_runs": 4, "run_timeout_s": 240}},
        "models": [{"path": str(zoo / n), "name": n} for n in SLICE],
    }))
    home = Path(os.environ.get("NPUPORT_HOME") or tmp_path / "home")
    env = {**os.environ, "NPUPORT_HOME": str(home)}
    env.setdefault("NPUPORT_ENV_CACHE", str(Path.home() / ".cache" / "npuport-tests" / "envs"))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "api.cli", "batch", str(manifest), "--executor", "local",
                           "--workers", "2", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1500)
    results = json.loads((out / "results.json").read_text())["ports"]
    by_name = {p["model"]: p for p in results}
    failed = {n: by_name.get(n, {}).get("reason", "no result") for n in SLICE
              if by_name.get(n, {}).get("verdict") != "validated"}
    assert not failed, f"{failed}\n{done.stdout[-3000:]}"
    for n in SLICE:
        report = json.loads((Path(by_name[n]["bundle"]) / "report.json").read_text())
        resolution = report["environment"]["resolution"]
        assert report["environment"]["python"], f"{n} ran on the host's transformers, not its era's"
        assert resolution["stack"]["transformers"].startswith("4."), (n, resolution["stack"])  # as installed
        assert any("environment of the model's era" in note for note in resolution["notes"]), n
        couplings = [f for f in report["findings"] if f["hazard"] == "H18"]
        assert couplings and all(f["line"] > 0 and f["message"] for f in couplings), n
        assert "Environment (every run):" in (Path(by_name[n]["bundle"]) / "report.md").read_text()
    chatglm = json.loads((Path(by_name["chatglm2-6b"]["bundle"]) / "report.json").read_text())
    assert any("default-jit-executor" in p["summary"] for p in chatglm["patches"])
    assert any(f["rule"] == "generation-config-attr" for f in chatglm["findings"])
    assert {n: _digest(zoo / n) for n in SLICE} == before  # the user's folders are never written
