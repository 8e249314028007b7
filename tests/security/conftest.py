"""Hostile model folders and a sandbox per isolation mode. Every test here plants an attack the way
a model would (its import-time code, a patch, an API call) and asserts it is contained and reported.

The ``box`` fixture runs each test under bubblewrap and, where the class applies to it, in process
mode. Process mode is declared unisolated (it runs only when asked for): tests of a guarantee only
bwrap gives skip there, saying so."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from agents.workspace import Workspace, tree_digest
from sandbox.harness.runner import HarnessRun, run_harness
from sandbox.isolation.process import BubblewrapSandbox, Limits, ProcessSandbox, Sandbox, bwrap_available
from sandbox.targets import Target

MANIFEST = """name: hostile
entry:
  class: modeling_hostile:TinyLM
config: config.json
inputs: modeling_hostile:make_inputs
run:
  method: generate
  kwargs: {max_new_tokens: 4}
"""

MODEL = '''import os, sys, subprocess, time
import torch
from torch import nn

{ATTACK}


class TinyLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = nn.Embedding(config["vocab"], 8)
        self.head = nn.Linear(8, config["vocab"])

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens=4):
{IN_GENERATE}
        ids = input_ids
        out = []
        for _ in range(max_new_tokens):
            nxt = self.head(self.emb(ids))[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            out.append(nxt)
        return torch.cat(out, dim=1)


def make_inputs(config, seed):
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, config["vocab"], (1, 5), generator=g)}
'''


def write_model(root: Path, attack: str = "", in_generate: str = "pass") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "npuport.yaml").write_text(MANIFEST)
    (root / "config.json").write_text(json.dumps({"vocab": 32}))
    body = "\n".join("        " + line for line in in_generate.splitlines())
    (root / "modeling_hostile.py").write_text(MODEL.replace("{ATTACK}", attack).replace("{IN_GENERATE}", body))
    return root


@dataclass
class Attack:
    original: Path
    ws: Workspace
    run: HarnessRun
    digest_before: str

    def original_untouched(self) -> bool:
        return tree_digest(self.original) == self.digest_before


@pytest.fixture(params=["bwrap", "process"])
def box(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "bwrap":
        bwrap = bwrap_available()
        if bwrap is None:
            pytest.skip("bubblewrap is not installed here (.ci/run installs it; CI runs these)")
        return BubblewrapSandbox(bwrap)
    return ProcessSandbox()


def needs_isolation(box: Sandbox) -> None:
    if box.name == "process":
        pytest.skip("process mode is declared unisolated (it runs only when asked for); bwrap holds this")


def run_attack(tmp_path: Path, box: Sandbox, attack: str = "", in_generate: str = "pass",
               limits: Limits | None = None) -> Attack:
    original = write_model(tmp_path / "user-model", attack, in_generate)
    before = tree_digest(original)
    ws = Workspace.create(original, tmp_path / "work")
    manifest = yaml.safe_load((ws.model_dir / "npuport.yaml").read_text())
    run = run_harness(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / "port", manifest=manifest,
                      target=Target("cpu", "cpu"), sandbox=box, limits=limits or Limits(wall_s=60))
    return Attack(original, ws, run, before)


@pytest.fixture()
def attack(tmp_path: Path, box: Sandbox):  # type: ignore[no-untyped-def]
    """``attack(code_at_import, code_in_generate, limits)`` -> Attack, run in ``box``. After the test,
    the user's original folder must be byte-identical, whatever the attack did."""
    done: list[Attack] = []

    def go(at_import: str = "", in_generate: str = "pass", limits: Limits | None = None) -> Attack:
        done.append(run_attack(tmp_path, box, at_import, in_generate, limits))
        return done[-1]

    yield go
    for a in done:
        assert a.original_untouched(), f"the user's original folder changed ({box.name})"


# --- the API attacks against a live `npuport serve` (bench/security.py --serve) ----------------------------

SERVE_ENV = ("NPUPORT_TEST_SERVE_URL", "NPUPORT_TEST_SERVE_HOME", "NPUPORT_TEST_SERVE_ROOTS")
SERVE_TOKENS = {"tok-a": ["read", "write"], "tok-b": ["read", "write"], "tok-admin": ["read", "write", "admin"]}
"""The tokens a live server for these attacks is started with (bench/security.py --serve)."""


def live_server() -> tuple[str, Path, Path] | None:
    """(URL, its NPUPORT_HOME, its model root) of a real `npuport serve` process these attacks go to over
    HTTP, when bench/security.py --serve started one; None: the app runs in-process (TestClient)."""
    url, home, roots = (os.environ.get(k, "") for k in SERVE_ENV)
    return (url, Path(home), Path(roots)) if url and home and roots else None


@contextlib.contextmanager
def api_client(home: Path, roots: Path, tokens: dict[str, list[str]]) -> Iterator[httpx.Client]:
    """A client of the service: the live server's over HTTP, else the app in-process with these settings."""
    live = live_server()
    if live is not None:
        with httpx.Client(base_url=live[0], timeout=120) as c:
            yield c
        return
    from fastapi.testclient import TestClient
    from test_api import make_settings
    from test_api_helpers import fake_builder

    from api.app import create_app

    with TestClient(create_app(make_settings(home, roots, tokens=tokens), graph_builder=fake_builder)) as c:
        yield c


@pytest.fixture()
def service_roots(tmp_path: Path) -> Path:
    """The model root of the service under attack (holds m1)."""
    live = live_server()
    if live is not None:
        return live[2]
    root = tmp_path / "models"
    (root / "m1").mkdir(parents=True)
    (root / "m1" / "npuport.yaml").write_text("name: m1\n")
    return root


@pytest.fixture()
def service_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The NPUPORT_HOME of the service under attack."""
    live = live_server()
    if live is not None:
        return live[1]
    home = tmp_path / "npuport-home"
    home.mkdir()
    monkeypatch.setenv("NPUPORT_HOME", str(home))
    return home


def in_process_only(reason: str) -> None:
    if live_server() is not None:
        pytest.skip(f"in-process only: {reason}")
