"""Manifest paths (issue #42): a path written in a model folder's npuport.yaml, a config link or a batch
manifest never leads npuport's own process out of the folder it came from. A ``config:`` that climbs out
(``..``, an absolute path, a link) is refused by the planner, the bundle writer and the batch stager; the
stager (CLI and ``POST /v1/batches``) writes only under the batch's own folder; names of ports and batches
are folder names npuport owns (never ``..``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agents.reading.entry import discover_entry
from graph.batch.manifest import BatchManifest, load_manifest, model_key
from graph.batch.sources import stage
from knowledge.errors import ManifestError, SourceError

from .conftest import SERVE_TOKENS, api_client, write_model

A = {"Authorization": "Bearer tok-a"}
VICTIM = {"keep": "me"}


def _victim(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    victim = where / "victim.json"
    victim.write_text(json.dumps(VICTIM))
    return victim


def _climbing_model(root: Path, config: str) -> Path:
    model = write_model(root)
    text = (model / "npuport.yaml").read_text().replace("config: config.json", f"config: {config}")
    (model / "npuport.yaml").write_text(text)
    return model


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link"])
def test_the_planner_refuses_a_config_out_of_the_folder(tmp_path: Path, how: str) -> None:
    victim = _victim(tmp_path / "outside")
    if how == "link":
        model = _climbing_model(tmp_path / "m", "cfg.json")
        (model / "cfg.json").symlink_to(victim)
    else:
        model = _climbing_model(tmp_path / "m", "../outside/victim.json" if how == "dotdot" else str(victim))
    with pytest.raises(ManifestError, match="outside|leaves"):
        discover_entry(model)
    from knowledge.errors import UntrustedValue
    from knowledge.untrusted import read_model_config

    with pytest.raises(UntrustedValue):  # every reader outside the sandbox (bundle, tuning, serving) goes through it
        read_model_config(model, {"config": "../outside/victim.json" if how == "dotdot" else
                                  ("cfg.json" if how == "link" else str(victim))})


@pytest.mark.parametrize("how", ["dotdot", "link-in-config", "config-json-link"])
def test_the_batch_stager_writes_nothing_outside(tmp_path: Path, how: str) -> None:
    """`shrink: {dict}` merges overrides into a staged copy's config: the file the manifest names must be in
    the copy (never `../../victim.json`, never a link to it), and the user's folder is never written."""
    victim = _victim(tmp_path / "outside")
    model = write_model(tmp_path / "models" / "m")
    if how == "dotdot":
        model = _climbing_model(tmp_path / "models" / "m", "../../outside/victim.json")
    elif how == "link-in-config":
        model = _climbing_model(tmp_path / "models" / "m", "cfg.json")
        (model / "cfg.json").symlink_to(victim)
    else:
        (model / "config.json").unlink()
        (model / "config.json").symlink_to(victim)
    staging = tmp_path / "home" / "batches" / "b" / "staging" / "m"
    with pytest.raises(SourceError):
        stage(model, "folder", {"vocab": 4}, staging)
    assert json.loads(victim.read_text()) == VICTIM
    assert not list(tmp_path.glob("victim.json")) and not (tmp_path / "home" / "victim.json").exists()


def test_a_staged_config_is_replaced_never_written_through(tmp_path: Path) -> None:
    """An archive unpacks under the batch's folder; its config is then rewritten as a new file, so a link
    left in the staged copy (the archive's) is never followed by the write."""
    model = write_model(tmp_path / "models" / "m")
    staging = tmp_path / "home" / "batches" / "b" / "staging" / "m"
    staged, note = stage(model, "folder", {"vocab": 8}, staging)
    assert staged.is_relative_to(staging) and "shrunk config" in note
    assert json.loads((staged / "config.json").read_text())["vocab"] == 8
    assert json.loads((model / "config.json").read_text())["vocab"] == 32  # the user's folder as it was


def test_port_keys_and_batch_names_are_never_paths(tmp_path: Path) -> None:
    for bad in ("..", ".", "../x", "a/b"):
        with pytest.raises(ValueError):
            BatchManifest.model_validate({"name": bad, "models": [{"path": "m"}]})
        with pytest.raises(ValueError):
            BatchManifest.model_validate({"models": [{"path": "m", "name": bad}]})
    for path in ("..", ".", "/", "x/.."):
        key = model_key(path)
        assert key not in (".", "..") and "/" not in key
    (tmp_path / "..m").mkdir()
    write_model(tmp_path / "..m" / "x")
    resolved = load_manifest(tmp_path / "..m")
    assert all(p.key not in (".", "..") for p in resolved.ports) and resolved.name not in (".", "..")


# --- through the HTTP API (POST /v1/batches) ---------------------------------------------------------

@pytest.fixture()
def client(service_home: Path, service_roots: Path) -> Iterator[httpx.Client]:
    with api_client(service_home, service_roots, SERVE_TOKENS) as c:
        yield c


def test_a_batch_through_the_api_writes_nothing_outside(client: httpx.Client, service_roots: Path,
                                                       service_home: Path, tmp_path: Path) -> None:
    """A model under the service's roots whose config is a link out, with a batch's shrink overrides: the
    port fails with the reason, the file outside every folder npuport owns is as it was."""
    victim = _victim(service_roots.parent / f"outside-{tmp_path.name}")
    name = f"climb-{tmp_path.name}"[:60]
    model = _climbing_model(service_roots / name, "cfg.json")  # a link the staged copy keeps, to a file outside
    (model / "cfg.json").symlink_to(victim)
    manifest = {"name": name, "defaults": {"shrink": {"vocab": 4}}, "models": [{"path": name}]}
    r = client.post("/v1/batches", json={"manifest": manifest, "executor": "local"}, headers=A)
    assert r.status_code in (200, 201), r.text
    bid = r.json()["id"]
    deadline, batch = time.time() + 120, {}
    while time.time() < deadline:
        batch = client.get(f"/v1/batches/{bid}", headers=A).json()
        if batch["status"] == "done":
            break
        time.sleep(0.5)
    assert batch.get("status") == "done", batch
    port = batch["ports"][0]
    assert port["status"] == "failed" and "config" in port["reason"], port
    assert json.loads(victim.read_text()) == VICTIM
