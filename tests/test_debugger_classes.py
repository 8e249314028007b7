"""The debugger's classes of plain Python failures (hazards H24-H26: agents/rules/h24_missing_names.py,
h25_changed_api.py, h26_generate_inputs.py): what the failing process tells (sandbox/harness/failure_hints.py,
on real exceptions), the diagnosis each class makes of it, the fixes' meaning (the original run against the
release it was written for, the rewritten code against the new one), the rule that no NameError, ImportError,
AttributeError or TypeError in model code or on the generate path ends as "no recipe covers", and toy releases
(tests/debug_models.py) ported end to end."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from agents.models import Frame, StructuredException
from agents.policies.rule import RulePolicy
from agents.rules.h24_missing_names import free_names, import_missing_name
from agents.rules.h25_changed_api import accept_new_keyword, rename_changed_api, same_word
from sandbox.harness.failure_hints import failure_hints
from tests.debug_models import TOY_UTILS, write_no_kwargs_lm, write_star_import_lm, write_token_type_vlm

REPO = Path(__file__).resolve().parents[1]


def _package(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    """A model folder importable as package ``name`` (as the harness imports the folder)."""
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    for rel, text in files.items():
        (root / rel).write_text(textwrap.dedent(text))
    return root


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("nothing raised")


def _exc(type_: str, message: str, *, in_model: bool = True, hints: dict[str, Any] | None = None,
         funcs: tuple[str, ...] = ("forward",)) -> StructuredException:
    frames = [Frame(file="/venv/transformers/generation/utils.py", line=9, func="generate")] if "generate" in funcs \
        else []
    frames.append(Frame(file="modeling_x.py" if in_model else "/venv/torch/nn/modules/module.py", line=12,
                        func=funcs[-1], in_model=in_model))
    return StructuredException(type=type_, message=message, frames=frames, hints=hints or {})


# --- what the failing process tells ------------------------------------------------------------------------

def test_a_name_an_old_star_import_provided_is_found_where_the_model_runs(tmp_path: Path) -> None:
    root = _package(tmp_path, "toypkg_star", {
        "toy_utils.py": TOY_UTILS,
        "other.py": "import torch.nn.functional as F\nfrom typing import List\n",
        "modeling.py": "from .toy_utils import *\n\ndef mix(x):\n    return rotate_half(x)\n\ndef acts(x):\n    return "
                       "F.relu(x)\n"})
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module("toypkg_star.modeling")
        import torch

        hints = failure_hints(_raised(lambda: mod.mix(torch.ones(4))), root)
        assert hints["name"] == "rotate_half"
        assert hints["providers"][0] == {"kind": "star-import", "module": ".toy_utils",
                                         "statement": "from .toy_utils import rotate_half"}
        f_hints = failure_hints(_raised(lambda: mod.acts(torch.ones(2))), root)
        assert f_hints["providers"][0]["statement"] == "import torch.nn.functional as F"  # as another file binds it
        assert hints["release"]  # the running transformers' version
    finally:
        sys.path.remove(str(tmp_path))


def test_close_spellings_and_signatures_come_from_the_live_objects(tmp_path: Path) -> None:
    class Cache:
        def get_seq_length(self) -> int:
            return 0

        past_key_values = None

    attr = failure_hints(_raised(lambda: Cache().past_key_value), tmp_path)
    assert attr["class"] == "test_close_spellings_and_signatures_come_from_the_live_objects.<locals>.Cache" \
        and "past_key_values" in attr["candidates"]
    # a module of the model's files, as the harness imports them (the callee is looked up there first: a library
    # imported earlier, e.g. torch.onnx.ops once transformers' models are, may define a function of the same name)
    (tmp_path / "toy_callee.py").write_text("def attention(hidden, past_key_values=None, layer_idx=0):\n"
                                            "    return hidden\n")
    spec = importlib.util.spec_from_file_location("toy_callee", tmp_path / "toy_callee.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["toy_callee"] = mod
    try:
        kw = failure_hints(_raised(lambda: mod.attention(1, past_key_value=None)), tmp_path)
    finally:
        del sys.modules["toy_callee"]
    assert kw["keyword"] == "past_key_value" and kw["candidates"] == ["past_key_values"]
    assert kw["parameters"] == ["hidden", "past_key_values", "layer_idx"]

    def prepare(input_ids, token_type_ids, images=None):  # noqa: ARG001
        return {}

    missing = failure_hints(_raised(lambda: prepare(1)), tmp_path)
    assert missing["missing"] == ["token_type_ids"]
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {"boi_token_id": 32001}, "vocab_size": 9}))
    token = failure_hints(_raised(lambda: [1, 2, 3].index(32001)), tmp_path)
    assert token == {"value": 32001, "config_keys": ["vision_config.boi_token_id"], "release": token["release"]}


# --- each class's diagnosis --------------------------------------------------------------------------------

def test_a_name_missing_at_run_time_is_imported_from_its_most_faithful_provider() -> None:
    providers = [{"kind": "typing", "module": "typing", "statement": "from typing import List"},
                 {"kind": "star-import", "module": "transformers.modeling_utils",
                  "statement": "from transformers.modeling_utils import List"}]
    diag = RulePolicy().diagnose("run-1", _exc("NameError", "name 'List' is not defined",
                                               hints={"name": "List", "providers": providers}), [])
    assert (diag.kind, diag.fix) == ("missing-name", "import-missing-name")
    assert diag.params == {"statement": "from transformers.modeling_utils import List", "name": "List"}
    sibling = [{"kind": "model-definition", "module": "utils", "file": "utils.py", "statement": ""}]
    diag = RulePolicy().diagnose("run-1", _exc("NameError", "name 'helper' is not defined",
                                               hints={"name": "helper", "providers": sibling}), [])
    assert diag.params["statement"] == "from .utils import helper"
    moved = {"name": "find_pruneable_heads_and_indices", "from_module": "transformers.modeling_utils",
             "providers": [{"kind": "transformers", "module": "transformers.pytorch_utils",
                            "statement": "from transformers.pytorch_utils import find_pruneable_heads_and_indices"}]}
    diag = RulePolicy().diagnose("run-1", _exc("ImportError", "cannot import name 'find_pruneable_heads_and_indices' "
                                               "from 'transformers.modeling_utils' (/venv/x.py)", hints=moved), [])
    assert diag.fix == "import-missing-name" and diag.params["from_module"] == "transformers.modeling_utils"
    # transformers' own name this release has nowhere: the environment's choice, named as the class
    gone = RulePolicy().diagnose("run-1", _exc("ImportError", "cannot import name 'GenerationMixin2' from "
                                               "'transformers' (/venv/x.py)",
                                               hints={"name": "GenerationMixin2", "providers": [],
                                                      "release": "5.25.0"}),
                                 [])
    assert gone.kind == "missing-name" and gone.fix is None
    assert "another transformers release may provide it" in gone.params["unfixed"]
    # a provider statement the failing process made up is not an import: refused
    bad = {"name": "x", "providers": [{"kind": "typing", "statement": "import os; os.system('x')"}]}
    assert RulePolicy().diagnose("run-1", _exc("NameError", "name 'x' is not defined", hints=bad), []).fix is None


def test_an_attribute_or_keyword_takes_the_running_releases_spelling_only_when_it_is_the_same_word() -> None:
    assert same_word("past_key_value", "past_key_values") and same_word("attn_implementation", "_attn_implementation")
    assert not same_word("get_max_length", "get_max_cache_shape")
    kw = RulePolicy().diagnose("run-1", _exc("TypeError", "LlamaAttention.forward() got an unexpected keyword argument "
                                             "'past_key_value'", hints={"keyword": "past_key_value",
                                                                        "candidates": ["past_key_values"]}), [])
    assert (kw.kind, kw.fix, kw.params) == ("changed-api", "rename-changed-api",
                                            {"line": 12, "old": "past_key_value", "new": "past_key_values",
                                             "what": "keyword"})
    attr = RulePolicy().diagnose("run-1", _exc("AttributeError", "'DynamicCache' object has no attribute "
                                               "'get_max_length'", hints={"attribute": "get_max_length",
                                                                          "candidates": ["get_max_cache_shape"]}), [])
    assert attr.kind == "changed-api" and attr.fix is None and "get_max_cache_shape" in attr.params["unfixed"]
    # the release calls the model's own forward with a keyword it added later
    new_kw = RulePolicy().diagnose("run-1", _exc(
        "TypeError", "ToyForCausalLM.forward() got an unexpected keyword argument 'cache_position'", in_model=False,
        hints={"keyword": "cache_position", "callee_file": "modeling_toy.py"}, funcs=("generate", "_call_impl")), [])
    assert (new_kw.fix, new_kw.file, new_kw.params) == ("accept-new-keyword", "modeling_toy.py",
                                                        {"function": "ToyForCausalLM.forward",
                                                         "keyword": "cache_position"})
    outside = RulePolicy().diagnose("run-1", _exc(
        "TypeError", "f() got an unexpected keyword argument 'z'", in_model=False,
        hints={"keyword": "z", "callee_file": "../../etc/passwd.py"}, funcs=("generate", "f")), [])
    assert outside.file is None or not outside.file.startswith("..")


def test_a_generate_path_input_the_model_builds_is_an_inputs_fix() -> None:
    diag = RulePolicy().diagnose("run-1", _exc("TypeError", "ToyVisionForCausalLM.prepare_inputs_for_generation() "
                                               "missing 1 required positional argument: 'token_type_ids'",
                                               in_model=False, funcs=("generate",)), [])
    assert (diag.kind, diag.fix) == ("generate-inputs", "rebuild-inputs")
    assert diag.params["needs"] == ["token_type_ids"] and diag.params["token"] is None
    token = RulePolicy().diagnose("run-1", _exc("ValueError", "32001 is not in list",
                                                hints={"value": 32001, "config_keys": ["boi_token_id"]}), [])
    assert (token.fix, token.params["token"], token.params["needs"]) == ("rebuild-inputs", 32001, [])
    assert "config boi_token_id" in token.summary
    failed = RulePolicy().diagnose("run-2", _exc("PreprocessingFailed", "rebuild-inputs: no input-building code of "
                                                 "the model gives token_type_ids (it has no builder or processor)",
                                                 in_model=False), [])
    assert failed.kind == "generate-inputs" and failed.fix is None
    assert "no input-building code" in failed.params["unfixed"]
    check = _exc("AssertionError", "image tokens and features do not match", funcs=("generate", "forward"),
                 hints={"inputs_source": "synthesised"})
    assert RulePolicy().diagnose("run-1", check, []).fix == "rebuild-inputs"
    own = check.model_copy(update={"hints": {"inputs_source": "preprocess"}})  # the model's own inputs already
    assert RulePolicy().diagnose("run-1", own, []).kind == "exception"


@pytest.mark.parametrize(("type_", "message", "in_model", "funcs"), [
    ("NameError", "name 'List' is not defined", True, ("forward",)),
    ("ImportError", "cannot import name 'X' from 'transformers.cache_utils' (/v/x.py)", True, ("<module>",)),
    ("ModuleNotFoundError", "No module named 'transformers.cache_utils'", True, ("<module>",)),
    ("AttributeError", "'NoneType' object has no attribute 'size'", True, ("forward",)),
    ("AttributeError", "module 'transformers.utils' has no attribute 'is_flash_attn_available'", True, ("<module>",)),
    ("TypeError", "forward() takes 2 positional arguments but 3 were given", True, ("forward",)),
    ("TypeError", "unsupported operand type(s) for +: 'NoneType' and 'int'", True, ("forward",)),
    ("TypeError", "'NoneType' object is not subscriptable", False, ("generate", "_sample")),
    ("AttributeError", "'GenerationConfig' object has no attribute '_eos_token_tensor'", False,
     ("generate", "_sample")),
])
def test_no_python_failure_in_model_code_or_on_the_generate_path_ends_as_no_recipe_covers(
        type_: str, message: str, in_model: bool, funcs: tuple[str, ...]) -> None:
    diag = RulePolicy().diagnose("run-1", _exc(type_, message, in_model=in_model, funcs=funcs), [])
    said = diag.params.get("unfixed") or ""
    assert diag.kind in ("missing-name", "changed-api", "generate-inputs", "missing-module"), diag
    assert diag.fix or (said and "no recipe covers" not in said and diag.kind in said), said


def test_a_failure_no_class_fits_names_the_class_it_came_closest_to() -> None:
    diag = RulePolicy().diagnose("run-1", _exc("KeyError", "'rope_type'"), [])
    assert diag.kind == "exception" and diag.fix is None
    assert diag.params["unfixed"].startswith("no recipe covers exception (closest class: changed-api")
    gen = RulePolicy().diagnose("run-1", _exc("IndexError", "index out of range", funcs=("generate", "forward")), [])
    assert "closest class: generate-inputs" in gen.params["unfixed"]


# --- the fixes keep meaning -----------------------------------------------------------------------------------

@pytest.mark.meaning("import-missing-name")
def test_an_added_import_gives_what_the_old_star_import_gave(tmp_path: Path) -> None:
    import torch

    modeling = "from .toy_utils import *\n\n\ndef mix(x):\n    return rotate_half(x) * 2\n"
    old_release = TOY_UTILS.replace('__all__ = ["ToyMixin"]', "")  # the module exported everything then
    fixed = import_missing_name(modeling, statement="from .toy_utils import rotate_half", name="rotate_half")
    assert fixed.changed and "from .toy_utils import rotate_half" in fixed.source
    results = []
    for name, utils, code in (("toypkg_old", old_release, modeling), ("toypkg_new", TOY_UTILS, fixed.source)):
        _package(tmp_path, name, {"toy_utils.py": utils, "modeling.py": code})
    sys.path.insert(0, str(tmp_path))
    try:
        for name in ("toypkg_old", "toypkg_new"):
            results.append(importlib.import_module(f"{name}.modeling").mix(torch.arange(6.0)))
    finally:
        sys.path.remove(str(tmp_path))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)
    # the static plan: a name nothing binds that typing provides
    src = "def f(x: List[int]) -> Optional[int]:\n    return x[0] if x else None\n"
    assert set(free_names(src)) == {"List", "Optional"}
    static = import_missing_name(src)
    ns: dict[str, Any] = {}
    exec(compile(static.source, "<static>", "exec"), ns)  # noqa: S102 - the test's own snippet
    assert ns["f"]([3, 4]) == 3
    # a helper that moved: the failing import is taken out and the new one added
    moved = import_missing_name("from transformers.modeling_utils import PreTrainedModel, helper\n\nx = helper\n",
                                statement="from transformers.pytorch_utils import helper", name="helper",
                                from_module="transformers.modeling_utils")
    assert "from transformers.modeling_utils import PreTrainedModel\n" in moved.source
    assert "from transformers.pytorch_utils import helper" in moved.source


@pytest.mark.meaning("rename-changed-api")
def test_a_respelled_attribute_or_keyword_reads_what_the_old_spelling_read() -> None:
    src = "def read(cfg, fn, x):\n    impl = cfg.attn_implementation\n    return fn(x, past_key_value=impl)\n"
    step = rename_changed_api(src, line=2, old="attn_implementation", new="_attn_implementation", what="attribute")
    both = rename_changed_api(step.source, line=3, old="past_key_value", new="past_key_values", what="keyword")
    assert both.changed and "cfg._attn_implementation" in both.source and "past_key_values=impl" in both.source
    old_ns: dict[str, Any] = {}
    new_ns: dict[str, Any] = {}
    exec(compile(src, "<old>", "exec"), old_ns)  # noqa: S102
    exec(compile(both.source, "<new>", "exec"), new_ns)  # noqa: S102
    old_cfg = types.SimpleNamespace(attn_implementation="sdpa")
    new_cfg = types.SimpleNamespace(_attn_implementation="sdpa")
    assert old_ns["read"](old_cfg, lambda x, past_key_value: (x, past_key_value), 1) == \
        new_ns["read"](new_cfg, lambda x, past_key_values: (x, past_key_values), 1)
    assert not rename_changed_api(src, line=2, old="attn_implementation", new="implementation",
                                  what="attribute").changed


@pytest.mark.meaning("accept-new-keyword")
def test_a_function_that_takes_a_newer_keyword_computes_what_it_did_without_it() -> None:
    src = ("class M:\n    def forward(self, input_ids, attention_mask=None):\n"
           "        return [i * 2 for i in input_ids]\n")
    out = accept_new_keyword(src, function="M.forward", keyword="cache_position")
    assert out.changed and "def forward(self, input_ids, attention_mask=None, **kwargs):" in out.source
    old_ns: dict[str, Any] = {}
    new_ns: dict[str, Any] = {}
    exec(compile(src, "<old>", "exec"), old_ns)  # noqa: S102
    exec(compile(out.source, "<new>", "exec"), new_ns)  # noqa: S102
    assert new_ns["M"]().forward([1, 2], cache_position=[0, 1]) == old_ns["M"]().forward([1, 2])
    assert not accept_new_keyword(out.source, function="M.forward", keyword="x").changed  # already takes them
    # the static plan: a forward of a class that generates through transformers' own prepare_inputs_for_generation
    static = ("class Lm(PreTrainedModel, GenerationMixin):\n    def forward(self, input_ids):\n"
              "        return input_ids\n")
    assert "def forward(self, input_ids, **kwargs):" in accept_new_keyword(static).source
    own = static + "\n    def prepare_inputs_for_generation(self, input_ids, **kw):\n        return {}\n"
    assert not accept_new_keyword(own).changed


# --- toy releases, ported as a user would ------------------------------------------------------------------------

def _port(model: Path, out: Path, home: Path) -> dict[str, Any]:
    env = dict(os.environ, NPUPORT_HOME=str(home), NPUPORT_SERVE="0", COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "api.cli", "port", str(model), "--target", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert (out / "report.json").is_file(), proc.stdout + proc.stderr
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
def test_a_release_whose_star_import_no_longer_gives_a_helper_validates(tmp_path: Path, npuport_home: Path) -> None:
    report = _port(write_star_import_lm(tmp_path / "m"), tmp_path / "out", npuport_home)
    assert report["numerics"]["verdict"] == "match", report["reason"]
    assert [d["kind"] for d in report["diagnoses"]] == ["missing-name"]
    assert [p["codemod"] for p in report["patches"]][-1] == "import-missing-name"
    ref = [r for r in report["runs"] if r["purpose"] == "reference"][-1]
    assert any("from .toy_utils import rotate_half" in n for n in ref["reference_adjusted"])


@pytest.mark.slow
def test_a_forward_without_kwargs_takes_the_keywords_a_newer_generate_passes(tmp_path: Path,
                                                                             npuport_home: Path) -> None:
    report = _port(write_no_kwargs_lm(tmp_path / "m"), tmp_path / "out", npuport_home)
    assert report["numerics"]["verdict"] == "match", report["reason"]
    # found by the scan and fixed before the first run; the original fails in this environment and gets the same fix
    assert report["diagnoses"] == [] and report["counters"]["port_runs"] == 1
    assert [p["codemod"] for p in report["patches"]] == ["accept-new-keyword"]
    ref = [r for r in report["runs"] if r["purpose"] == "reference"][-1]
    assert any("ToyForCausalLM.forward` takes **kwargs" in n for n in ref["reference_adjusted"])


@pytest.mark.slow
def test_a_vlm_whose_generate_needs_token_types_gets_its_own_built_inputs(tmp_path: Path, npuport_home: Path) -> None:
    report = _port(write_token_type_vlm(tmp_path / "m"), tmp_path / "out", npuport_home)
    assert report["numerics"]["verdict"] == "match", report["reason"]
    assert [(d["kind"], d["fix"]) for d in report["diagnoses"]] == [("generate-inputs", "rebuild-inputs")]
    assert report["patches"] == []  # an inputs fix, not a code patch
    port_run = [r for r in report["runs"] if r["purpose"] == "port"][-1]
    assert port_run["inputs"]["source"] == "model-built"
    assert "build_conversation_input_ids" in port_run["inputs"]["notes"][0]
    assert "inputs fix (not a code patch)" in port_run["inputs"]["notes"][0]


# --- the inputs fix and the reference's replay, in process -------------------------------------------------------

def test_the_models_own_builder_gives_the_inputs_the_generate_path_needs(tmp_path: Path) -> None:
    import torch

    from sandbox.inputs.inputs_base import PreprocessingFailed
    from sandbox.inputs.own_inputs import input_builders, own_built_inputs

    root = write_token_type_vlm(tmp_path / "vlm")
    sys.path.insert(0, str(tmp_path))
    (root / "__init__.py").write_text("")
    try:
        modeling = importlib.import_module("vlm.modeling_toy")
        config = importlib.import_module("vlm.configuration_toy").ToyConfig(**json.loads(
            (root / "config.json").read_text()))
        model = modeling.ToyVisionForCausalLM(config)
        assert [n for n, _ in input_builders(model, ["token_type_ids"])] == ["build_conversation_input_ids"]
        inputs, kwargs, notes = own_built_inputs(model, root, config.to_dict(), 0, ["token_type_ids"])
        assert inputs["input_ids"].shape == inputs["token_type_ids"].shape and inputs["input_ids"].dim() == 2
        assert int(inputs["token_type_ids"][0, :4].sum()) == 4  # the image's tokens, made by the model's code
        assert isinstance(inputs["images"], list) and isinstance(inputs["images"][0][0], torch.Tensor)
        assert "ToyVisionForCausalLM.build_conversation_input_ids()" in notes[0]
        out = model.generate(**inputs, max_new_tokens=2, do_sample=False)
        assert out.shape[1] == inputs["input_ids"].shape[1] + 2
        with pytest.raises(PreprocessingFailed, match="no input-building code of the model gives pixel_mask"):
            own_built_inputs(model, root, config.to_dict(), 0, ["pixel_mask"])
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "vlm" or m.startswith("vlm.")]:
            del sys.modules[name]


def test_the_reference_copy_replays_the_ports_environment_fixes_only(tmp_path: Path) -> None:
    from agents.models import Diagnosis, Patch
    from agents.validation.reference import adjust_tree, environment_replay

    def patch(n: int, codemod: str, file: str, diagnosis: str | None) -> Patch:
        return Patch(id=f"patch-{n}", commit="0" * 40, summary=codemod, codemod=codemod, files=[file],
                     diagnosis_id=diagnosis)

    patches = [patch(1, "import-missing-name", "m.py", "diag-1"), patch(2, "complex-to-real", "m.py", None),
               patch(3, "import-missing-name", "../outside.py", None)]
    diagnoses = [Diagnosis(id="diag-1", run_id="run-1", signature="s", kind="missing-name", summary="",
                           params={"statement": "from typing import List", "name": "List"})]
    replay = environment_replay(patches, diagnoses)
    assert [r["codemod"] for r in replay] == ["import-missing-name", "import-missing-name"]
    root = tmp_path / "original"
    root.mkdir()
    (root / "m.py").write_text("def f(x: List[int]):\n    return x\n")
    (tmp_path / "outside.py").write_text("def g(x: List[int]):\n    return x\n")
    notes = adjust_tree(root, replay)
    assert "from typing import List" in (root / "m.py").read_text() and notes
    assert "from typing" not in (tmp_path / "outside.py").read_text()  # never outside the reference copy
