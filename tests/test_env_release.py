"""The transformers release a model's code runs with, chosen by what the code reads (agents/environment/
api_needs.py), asked of each release's API index (api_index.py, api_release.py: read from the wheels, never
imported), config.json's release a hint (release_choice.py); a run that fails on a name its release lacks
moves to the next candidate (release_retry.py, wired in the debugger); a guessed package the index lacks is
left out with a note (layered.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from agents.environment.api_needs import code_needs
from agents.environment.compat import host_version

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_ERA = REPO_ROOT / "tests" / "fixtures" / "hf_cache_era"
needs_tf5 = pytest.mark.skipif(not (host_version("transformers") or "").startswith("5."),
                               reason="the host's transformers is not 5.x")


def _wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> None:
    """A hand-made wheel (pip installs it; only its files matter)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: npuport-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(c.encode())}" for p, c in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for path, content in files.items():
            z.writestr(path, content)


def _release(folder: Path, version: str, files: dict[str, str]) -> None:
    """A stand-in transformers release: its sources are read (and it installs), never run."""
    _wheel(folder, "transformers", version, {f"transformers/{p}": c for p, c in
                                            {"__init__.py": f'__version__ = "{version}"\n', **files}.items()})


@pytest.fixture()
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package index of hand-made wheels (pip reads nothing else), a private wheel cache and home."""
    wheels = tmp_path / "index"
    wheels.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("NPUPORT_WHEEL_CACHE", str(tmp_path / "wheel-cache"))
    monkeypatch.setenv("NPUPORT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NPUPORT_KB", "off")
    monkeypatch.delenv("NPUPORT_ENV_CACHE", raising=False)  # set, the sandbox would bind the whole cache
    return wheels


def test_what_the_code_reads_from_transformers(tmp_path: Path) -> None:
    """Imports, attribute chains on imported names, super() and inherited calls of classes derived from
    transformers classes, a transformers logger's additions; guarded reads and the model's own are none."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_m.py").write_text(textwrap.dedent("""\
        import transformers.cache_utils
        from transformers import PreTrainedModel, GenerationMixin
        from transformers.utils import logging
        try:
            from transformers.integrations import flash_guarded
        except ImportError:
            flash_guarded = None
        if hasattr(transformers, "shiny"):
            transformers.shiny.call()

        logger = logging.get_logger(__name__)


        class Base(PreTrainedModel):
            _supports_x = PreTrainedModel._supports_sdpa

            def helper(self):
                return 1


        class M(Base):
            def forward(self, x):
                logger.warning_once("x")
                self.helper()
                self.config.anything
                GenerationMixin._extract_past_from_model_output(self, x)
                self.to("cpu")
                return self._own(x) + self.inherited_thing(x)

            def _own(self, x):
                return x

            def generate(self, *a, **k):
                return super().generate(*a, **k)
        """))
    found = {(n.how, n.paths) for n in code_needs(model)}
    assert found == {
        ("import", ("transformers.cache_utils",)),
        ("import", ("transformers.PreTrainedModel",)),
        ("import", ("transformers.GenerationMixin",)),
        ("import", ("transformers.utils.logging",)),
        ("attribute", ("transformers.utils.logging.get_logger",)),
        ("attribute", ("transformers.PreTrainedModel._supports_sdpa",)),
        ("attribute", ("transformers.GenerationMixin._extract_past_from_model_output",)),
        ("logger", ("logging.Logger.warning_once",)),
        ("inherited call", ("transformers.PreTrainedModel.inherited_thing",)),
        ("super()", ("transformers.PreTrainedModel.generate",)),
    }, found


def test_the_api_index_of_real_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real releases' wheels (downloaded once into NPUPORT_WHEEL_CACHE, read as files): 4.33 has no
    transformers.cache_utils, 4.36 has it; names, re-exports, inherited members and what the release sets on
    the standard library's Logger resolve."""
    from agents.environment.api_release import release_api

    # the wheels CI keeps (conftest.py's session cache), downloaded once
    monkeypatch.setenv("NPUPORT_WHEEL_CACHE", os.environ.get("NPUPORT_WHEEL_CACHE")
                       or str(Path.home() / ".cache" / "npuport-tests" / "wheels"))
    old, new = release_api("4.33.3"), release_api("4.36.2")
    assert old is not None and new is not None
    assert not old.provides("transformers.cache_utils") and new.provides("transformers.cache_utils")
    assert new.provides("transformers.cache_utils.DynamicCache.from_legacy_cache")
    assert not new.provides("transformers.cache_utils.DynamicCache.no_such_member")
    for api in (old, new):
        assert api.provides("transformers.PreTrainedModel.generate")  # inherited from GenerationMixin
        assert api.provides("transformers.generation.utils.GenerationMixin._extract_past_from_model_output")
        assert api.provides("transformers.modeling_utils.PreTrainedModel.post_init")
        assert api.provides("transformers.models.llama.modeling_llama.LlamaRMSNorm")  # read when asked
        assert api.provides("logging.Logger.warning_once")
        assert not api.provides("transformers.no_such_name")
        # a processor sets its attributes by computed names (setattr(self, name, ...)): any member read is there
        assert api.provides("transformers.processing_utils.ProcessorMixin.tokenizer")


@needs_tf5
def test_a_config_hint_loses_to_code_that_imports_a_later_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """config.json names 4.33, the code imports transformers.cache_utils (4.36+): the era is 4.36, and the
    notes say why the hint lost."""
    from agents.environment.resolve import resolve

    monkeypatch.setenv("NPUPORT_TRANSFORMERS_RELEASES", "4.33.3,4.36.2")
    res = resolve(CACHE_ERA, "cpu", None)
    assert res.era == "transformers~=4.36.0" and res.install[0] == "transformers~=4.36.0"
    assert res.release_choice and res.release_choice["chosen"] == "4.36.2"
    assert [t["release"] for t in res.release_choice["tried"]] == ["4.33.3", "4.36.2"]
    note = next(n for n in res.notes if "The code wins" in n)
    assert "config.json's transformers 4.33.0" in note and "4.33.3 lacks transformers.cache_utils.DynamicCache" in note
    assert "modeling_cache_lm.py:8" in note
    from agents.environment.release_choice import choice_text  # the report's environment line says it too

    shown = choice_text(res.as_dict()) or ""
    assert shown.startswith("transformers 4.36.2 chosen by what the code reads") and "4.33.3 lacks" in shown


def test_the_choice_finds_the_nearest_line_that_has_every_read(local_index: Path, tmp_path: Path) -> None:
    """Saved with 4.23 by code importing transformers.generation (4.26+), calling logger.warning_once (4.27+)
    and a helper 4.28 removed: 4.27, found by trying lines at growing steps up from the hint (the newest line
    says which way), then halving back; never the newest."""
    from agents.environment.api_needs import code_needs
    from agents.environment.api_release import release_api
    from agents.environment.release_choice import choose_release

    old = {"generation_utils.py": "class GenerationMixin:\n    def _extract_past(self): ...\n",
           "modeling_utils.py": "from .generation_utils import GenerationMixin\n"
                                "class PreTrainedModel(GenerationMixin): ...\n",
           "utils/__init__.py": "from . import logging\n",
           "utils/logging.py": "import logging\ndef get_logger(name): ...\n"}
    new = {**old, "generation/__init__.py": "from .utils import GenerationMixin\n",
           "generation/utils.py": old["generation_utils.py"] + "class LogitsProcessorList: ...\n",
           "modeling_utils.py": ("from .generation import GenerationMixin\n"
                                 "class PreTrainedModel(GenerationMixin): ...\n")}
    once = {**new, "utils/logging.py": old["utils/logging.py"] + "def warning_once(self, *a): ...\n"
                                                                 "logging.Logger.warning_once = warning_once\n"}
    gone = {**once, "generation/utils.py": "class GenerationMixin: ...\nclass LogitsProcessorList: ...\n"}
    lines = {}
    for minor, files in [(23, old), (24, old), (25, old), (26, new), (27, once), (28, gone), (29, gone), (30, gone)]:
        _release(local_index, f"4.{minor}.0", files)
        lines[(4, minor)] = f"4.{minor}.0"
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_m.py").write_text(textwrap.dedent("""\
        from transformers.generation.utils import LogitsProcessorList
        from transformers.modeling_utils import PreTrainedModel
        from transformers.utils import logging

        logger = logging.get_logger(__name__)


        class M(PreTrainedModel):
            def forward(self, x):
                logger.warning_once("added by transformers 4.27's logging")
                return self._extract_past(x), self.register_buffer("b", x)
        """))
    choice = choose_release(code_needs(model), (4, 23), lines, release_api)
    assert choice.chosen == "4.27.0"
    assert [v.release for v in choice.tried] == ["4.23.0", "4.30.0", "4.24.0", "4.25.0", "4.27.0", "4.26.0"]
    assert "logging.Logger.warning_once (modeling_m.py:10)" in choice.tried[-1].lacks[0]
    assert any("_extract_past" in lack for lack in choice.tried[1].lacks)  # the newest removed the helper
    # a helper only the hint's release and the newest were asked about, and nothing else missing: it waits for a
    # run that fails on it (a member set at run time, a path never run); once a run has, older lines are searched
    (model / "modeling_m.py").write_text("from transformers.modeling_utils import PreTrainedModel\n\n\n"
                                         "class M(PreTrainedModel):\n    def f(self, x):\n"
                                         "        return self._extract_past(x)\n")
    lazy = choose_release(code_needs(model), (4, 28), lines, release_api)
    assert lazy.chosen == "4.28.0" and [v.release for v in lazy.tried] == ["4.28.0", "4.30.0"]
    assert lazy.ignored == ["transformers.modeling_utils.PreTrainedModel._extract_past (modeling_m.py:6)"]
    failed = choose_release(code_needs(model), (4, 28), lines, release_api,
                            rejected={(4, 28): "AttributeError: 'M' object has no attribute '_extract_past'"})
    assert failed.chosen == "4.27.0"
    # what the questions read stays in the index, next to the wheel (never imported, never installed)
    assert (Path(str(release_api("4.27.0").path)).parent / "4.27.0.json").is_file()  # type: ignore[union-attr]


def _failed_run(exc_type: str, message: str) -> dict[str, object]:
    return {"id": "run-1", "purpose": "port", "target": "cpu", "ok": False, "status": "error", "wall_s": 1.0,
            "result_path": "", "exception": {"type": exc_type, "message": message,
                                             "frames": [{"file": "modeling_m.py", "line": 9, "in_model": True}]}}


@pytest.mark.slow
def test_a_run_failing_on_a_name_its_release_lacks_moves_to_the_next_candidate(local_index: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The code imports DynamicCache (4.36+) and reads a cache class by a name built at run time, which 4.36
    lacks: the debugger rejects 4.36, builds 4.37's environment and runs again (the patcher commits nothing);
    a failure there with no candidate left ends the retries. Real pip, real venvs, a local index."""
    from agents.environment.layered import ensure_env
    from agents.environment.release_retry import RELEASE_FIX
    from agents.environment.resolve import resolve
    from agents.nodes.debugger import debugger_node
    from agents.nodes.patcher import patcher_node

    cache = "from .dynamic import DynamicCache\n"
    _release(local_index, "4.33.0", {"modeling_utils.py": "class PreTrainedModel: ...\n"})
    _release(local_index, "4.36.0", {"modeling_utils.py": "class PreTrainedModel: ...\n",
                                     "cache_utils.py": cache, "dynamic.py": "class DynamicCache: ...\n"})
    _release(local_index, "4.37.0", {"modeling_utils.py": "class PreTrainedModel: ...\n",
                                     "cache_utils.py": cache + "class SinkCache: ...\n",
                                     "dynamic.py": "class DynamicCache: ...\n"})
    _wheel(local_index, "einops", "0.8.0", {"einops/__init__.py": ""})  # the era's base env brings it
    monkeypatch.setenv("NPUPORT_TRANSFORMERS_RELEASES", "4.33.0,4.36.0,4.37.0")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"transformers_version": "4.33.0"}))
    (model / "modeling_m.py").write_text(textwrap.dedent("""\
        import transformers.cache_utils as caches
        from transformers.cache_utils import DynamicCache
        from transformers.modeling_utils import PreTrainedModel


        class M(PreTrainedModel):
            def cache(self, kind):
                return getattr(caches, kind + "Cache")
        """))
    res = resolve(model, "cpu", None)
    assert res.era == "transformers~=4.36.0"
    python = ensure_env(res)
    state = {"request": {"model_path": str(model), "target": "cpu", "max_runs": 8}, "started_at": time.time(),
             "counters": {"port_runs": 1},
             "runs": [_failed_run("AttributeError", "module 'transformers.cache_utils' has no attribute 'SinkCache'")],
             "environment": {"resolution": res.as_dict(), "python": str(python)}, "diagnoses": []}
    update = debugger_node(state)
    diag = update["diagnoses"][0]
    assert diag["fix"] == RELEASE_FIX and diag["params"]["release"] == "4.37.0", diag
    assert "4.36: AttributeError" in diag["summary"] and "transformers.cache_utils.SinkCache" in diag["summary"]
    env = update["environment"]
    assert env["resolution"]["release_rejected"] == {"4.36": "AttributeError: module 'transformers.cache_utils' "
                                                              "has no attribute 'SinkCache'"}
    base = Path(env["resolution"]["era_base"])
    assert list(base.glob("lib/python*/site-packages/transformers-4.37.0.dist-info"))
    passed = patcher_node({**state, **update, "workdir": str(tmp_path / "work"),
                           "pending_diagnosis": update["pending_diagnosis"]})
    assert passed["pending_diagnosis"] is None and "patches" not in passed and "status" not in passed
    # 4.37 fails too: no release left that provides every read, so the debugger goes on as before
    again = {**state, **update, "runs": [_failed_run("ImportError", "cannot import name 'QuantCache' from "
                                                     "'transformers.cache_utils' (/x/cache_utils.py)")],
             "diagnoses": update["diagnoses"]}
    assert debugger_node(again)["diagnoses"][0]["fix"] != RELEASE_FIX


@pytest.mark.slow
def test_a_guessed_package_the_index_lacks_is_left_out_with_a_note(local_index: Path, tmp_path: Path) -> None:
    """The code imports a module no distribution on the index is named after (its folder's own package,
    which the release does not ship) and one that exists, and pins a package it imports only in a function,
    which the index lacks: the env is built with the one that exists, the others are notes."""
    from agents.environment.layered import ensure_env
    from agents.environment.resolve import resolve

    _wheel(local_index, "npuport-extra-b", "1.0", {"npuport_extra_b/__init__.py": "B = 2\n"})
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_m.py").write_text("import npuport_extra_b\nimport npuport_not_on_any_index\n\n\n"
                                         "def stream():\n    import npuport_streaming\n")
    # a pin the code imports only in a function (a streaming helper) may go too; one nothing imports may not
    (model / "requirements.txt").write_text("npuport-streaming==0.1\n")
    res = resolve(model, "cpu", None)
    assert sorted(res.install) == ["npuport-extra-b", "npuport-not-on-any-index", "npuport-streaming==0.1"]
    python = ensure_env(res)
    assert python is not None
    assert list(python.parent.parent.glob("lib/python*/site-packages/npuport_extra_b"))
    note = next(n for n in res.notes if n.startswith("npuport-not-on-any-index is left out"))
    assert "npuport-not-on-any-index" in note and "import npuport_not_on_any_index" in note, note
    assert "left out" in res.dropped["npuport-not-on-any-index"]
    streaming = next(n for n in res.notes if n.startswith("npuport-streaming==0.1 is left out"))
    assert "imported only on a path of the code (modeling_m.py:6" in streaming, streaming


@needs_tf5
def test_a_hint_past_the_last_line_that_gives_generate_keeps_its_line(local_index: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """config.json names 4.52 (past 4.49, the last line whose PreTrainedModel gives generate) and its release
    has every read: the era stays 4.52, never pulled down to 4.49."""
    from agents.environment.resolve import resolve

    for version in ("4.49.0", "4.52.0"):
        _release(local_index, version, {"modeling_utils.py": "class PreTrainedModel: ...\n"})
    monkeypatch.setenv("NPUPORT_TRANSFORMERS_RELEASES", "4.49.0,4.52.0")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"transformers_version": "4.52.4"}))
    (model / "modeling_m.py").write_text("from transformers.modeling_utils import PreTrainedModel\n")
    res = resolve(model, "cpu", None)
    assert res.era == "transformers~=4.52.0"
    assert res.release_choice and res.release_choice["chosen"] == "4.52.0"
