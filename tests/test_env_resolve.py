"""agents/environment/resolve.py: the compatibility table, the model's pins, conflicts in plain words, the
bundle's requirements / constraints, and the layered sandbox environment.

Nothing is faked: pip runs for real. The acceptance test needs the package registry (it installs
transformers 4.46.3 once into a cached layered env) and is skipped only when the registry cannot be
reached; the failure test runs pip offline against an empty wheel folder.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from agents.environment.compat import companion_version, detect_cann, host_version, load_compat, torch_npu_row
from agents.environment.layered import MARKER, ensure_env
from agents.environment.pins import find_pins
from agents.environment.resolve import resolve
from knowledge.errors import EnvBuildError
from tests.tiny_models import write_tiny_model

REPO = Path(__file__).resolve().parents[1]
HOST_TORCH = md.version("torch")
HOST_TRANSFORMERS = md.version("transformers") if host_version("transformers") else None


def _model(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "model"
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# ---------------------------------------------------------------------------------------------
# The compatibility table agrees with the published tables it was written from
# ---------------------------------------------------------------------------------------------


def _md_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not set(line) <= set("|:- ")]


def test_torch_npu_rows_match_the_published_table(shared_data: Path) -> None:
    compat = load_compat()
    published: dict[str, tuple[str, str]] = {}
    for row in _md_rows((shared_data / "ascend-pytorch-docs" / "COMPATIBILITY.en.md").read_text()):
        if len(row) == 4 and re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", row[0]):
            published.setdefault(row[0], (row[2], row[3].removeprefix("CANN ").strip()))
    checked = 0
    for version, row in compat["torch_npu"].items():
        if version in published:
            torch_v, cann = published[version]
            assert row["torch"] == torch_v and cann in row["cann"], version
            checked += 1
        assert row["torch"] in compat["torch_python"], f"no Python list for torch {row['torch']}"
    assert checked >= 30


def test_vllm_ascend_rows_match_the_published_matrix(shared_data: Path) -> None:
    compat = load_compat()
    published = {}
    for row in _md_rows((shared_data / "vllm-ascend-docs" / "versioning_policy.md").read_text()):
        if len(row) >= 5 and re.fullmatch(r"v\d+\.\d+\.\d+\S*", row[0]):
            published[row[0][1:]] = row
    for version, row in compat["vllm_ascend"].items():
        pub = published[version]
        assert row["cann"] == pub[3]
        torch_v, torch_npu = (p.strip() for p in pub[4].split("/"))
        assert (row["torch"], row["torch_npu"]) == (torch_v, torch_npu), version
        assert pub[1].lstrip("v").startswith(row["vllm"])


def test_torch_npu_lookup_and_companions() -> None:
    compat = load_compat()
    assert torch_npu_row("2.10.0.post4", compat) == {"version": "2.10.0.post4", "torch": "2.10.0",
                                                         "cann": ["9.1.0"]}
    bare = torch_npu_row("2.9.0.post1", compat)  # not a row: matched to its release's builds
    assert bare is not None and bare["torch"] == "2.9.0" and {"8.5.0", "9.0.0", "9.1.0"} <= set(bare["cann"])
    assert torch_npu_row("3.0.0", compat) is None
    assert companion_version("torchvision", "2.13.0", compat) == "0.28.*"
    assert companion_version("torchvision", "2.1.0", compat) == "0.16.*"
    assert companion_version("torchaudio", "2.5.1", compat) == "2.5.*"


# ---------------------------------------------------------------------------------------------
# The model's pins
# ---------------------------------------------------------------------------------------------


def test_find_pins_reads_requirements_setup_pyproject_and_readme(tmp_path: Path) -> None:
    root = _model(tmp_path, {
        "requirements.txt": "# core\ntransformers==4.46.3  # tested\n-r requirements/extra.txt\n"
                            "git+https://github.com/x/y.git\nwinonly; sys_platform == 'win32'\n--index-url z\n",
        "requirements/extra.txt": "einops>=0.7\n",
        "setup.py": "from setuptools import setup\nDEPS = ['accelerate>=0.20', 'safetensors']\n"
                    "setup(name='m', install_requires=DEPS)\n",
        "pyproject.toml": "[project]\nname = 'm'\ndependencies = ['sentencepiece==0.1.99']\n",
        "README.md": "Install:\n\n```bash\npip install -U --extra-index-url https://x torch==2.1.0 'timm>=0.9' "
                     "&& python demo.py\npython -m pip install -e . flash-attn==2.5.8 --no-build-isolation\n"
                     "pip install -r requirements.txt\n```\n",
    })
    pins = {(p.name, p.requirement, p.source) for p in find_pins(root)}
    assert pins == {
        ("transformers", "transformers==4.46.3", "requirements.txt:2"),
        ("einops", "einops>=0.7", "requirements/extra.txt:1"),
        ("sentencepiece", "sentencepiece==0.1.99", "pyproject.toml"),
        ("accelerate", "accelerate>=0.20", "setup.py:2"),
        ("safetensors", "safetensors", "setup.py:2"),
        ("torch", "torch==2.1.0", "README.md:4"),
        ("timm", "timm>=0.9", "README.md:4"),
        ("flash-attn", "flash-attn==2.5.8", "README.md:5"),
    }


# ---------------------------------------------------------------------------------------------
# Resolution: conflicts in plain words, what the layered env installs, the bundle files
# ---------------------------------------------------------------------------------------------


def test_resolve_explains_conflicts_and_plans_the_layered_env(tmp_path: Path) -> None:
    root = _model(tmp_path, {
        "requirements.txt": "torch==2.1.0\ntransformers==4.46.3\nxformers==0.0.23\npyyaml>=5\n",
        "README.md": "pip install transformers==4.40.0 torchvision==0.16.0\n",
    })
    res = resolve(root, "ascend-sim", "2.13.0")
    assert res.stack["torch"] == "2.13.0" and res.stack["torch_npu"] == "2.13.0"
    assert res.stack["transformers"] == "4.46.3"
    text = "\n".join(res.conflicts)
    assert "torch_npu 2.13.0 needs torch 2.13.0, but the model pins torch==2.1.0 (requirements.txt:1)" in text
    assert "requirements.txt:2 pins transformers==4.46.3 but README.md:1 asks for transformers==4.40.0" in text
    assert "xformers==0.0.23 (requirements.txt:3), which is CUDA-only" in text
    assert "torch 2.13.0 pairs with torchvision 0.28.*" in text
    assert set(res.dropped) == {"torch", "torchvision", "xformers"}
    assert res.pins == {"transformers": "transformers==4.46.3", "pyyaml": "pyyaml>=5"}
    # The host has PyYAML >= 5 (npuport needs it), so only transformers is installed, and only
    # when the host's differs.
    expected = [] if HOST_TRANSFORMERS == "4.46.3" else ["transformers==4.46.3"]
    assert res.install == expected and res.needs_layered_env == bool(expected)

    req = res.requirements_txt.splitlines()
    assert req[0].startswith("# Generated by npuport for target ascend-sim, torch_npu 2.13.0")
    assert req[1:] == ["torch==2.13.0", "torch-npu==2.13.0", "pyyaml>=5", "transformers==4.46.3"]
    con = res.constraints_txt.splitlines()[1:]
    assert con == ["torch==2.13.0", "torchvision==0.28.*", "torchaudio==2.13.*", "torch-npu==2.13.0",
                   "transformers==4.46.3"]
    json.dumps(res.as_dict())  # the record the graph stores is plain JSON


def test_resolve_vllm_pairing_and_its_transformers_floor(tmp_path: Path) -> None:
    root = _model(tmp_path, {"requirements.txt": "vllm==0.11.0\ntransformers==4.46.3\n"})
    res = resolve(root, "npu", "2.13.0")
    assert res.stack["vllm"] == "0.11.0" and res.stack["vllm_ascend"] == "0.11.0"
    text = "\n".join(res.conflicts)
    assert ("vllm-ascend 0.11.0 (for vLLM 0.11.0) needs torch_npu 2.7.1.post1 with torch 2.7.1, but the port "
            "targets torch_npu 2.13.0") in text
    assert "the model pins transformers==4.46.3 (requirements.txt:2) but vLLM 0.11.0" in text
    assert "needs transformers>=4.55.2" in text
    assert "vllm-ascend==0.11.0" in res.requirements_txt and "vllm==0.11.0" in res.constraints_txt
    assert "vllm" in res.dropped and not any(i.startswith("vllm") for i in res.install)

    none = resolve(_model(tmp_path / "b", {"requirements.txt": "vllm\n"}), "npu", "2.13.0")
    assert any("no published vllm-ascend release pairs with torch_npu 2.13.0" in c for c in none.conflicts)
    paired = resolve(_model(tmp_path / "c", {"requirements.txt": "vllm\n"}), "npu", "2.9.0")
    assert paired.stack["vllm_ascend"] == "0.19.1rc1" and not any("vllm-ascend" in c for c in paired.conflicts)


def test_resolve_targets_python_cann_and_unknown_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _model(tmp_path, {"requirements.txt": "torch==2.1.0\n"})
    cpu = resolve(root, "cpu", None)
    assert cpu.stack["torch_npu"] is None and "torch-npu" not in cpu.requirements_txt
    assert any(f"the cpu target runs the host's torch {Version(HOST_TORCH).base_version}" in c
               for c in cpu.conflicts)

    unknown = resolve(root, "npu", "9.9.9")
    assert any("torch_npu 9.9.9 is not in the compatibility table" in c for c in unknown.conflicts)

    old = resolve(root, "npu", "2.2.0")  # torch 2.2 has no Python 3.11 builds
    assert any("torch 2.2.0 (for torch_npu 2.2.0) supports Python 3.8, 3.9, 3.10" in c for c in old.conflicts) \
        == (sys.version_info[:2] == (3, 11))
    assert any(f"but this host runs torch {HOST_TORCH}" in c for c in old.conflicts)

    toolkit = tmp_path / "Ascend" / "latest"
    (toolkit / "x86_64-linux").mkdir(parents=True)
    (toolkit / "x86_64-linux" / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann\nversion=8.0.0\n")
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(toolkit))
    assert detect_cann() == "8.0.0"
    on_npu = resolve(_model(tmp_path / "d", {}), "npu", "2.5.1")
    assert any("published for CANN 8.1.RC1, but the installed CANN is 8.0.0" in c for c in on_npu.conflicts)
    matched = resolve(_model(tmp_path / "e", {}), "npu", "2.4.0.post2")
    assert not any("CANN" in c for c in matched.conflicts) and matched.stack["cann"] == "8.0.0"


def test_the_examples_resolve() -> None:
    tiny = resolve(REPO / "examples" / "tiny_llm", "ascend-sim", "2.13.0")
    assert {"xformers", "triton", "torch"} <= set(tiny.dropped)
    assert tiny.pins == {"transformers": "transformers==4.34.1"}
    assert any("the model pins torch==2.1.2 (requirements.txt:2)" in c for c in tiny.conflicts)
    assert tiny.needs_layered_env == (HOST_TRANSFORMERS != "4.34.1")

    ocr = resolve(REPO / "examples" / "ocr_mini", "ascend-sim", "2.13.0")
    assert ocr.found == [] and not ocr.needs_layered_env and ocr.conflicts == []
    assert ensure_env(ocr) is None, "the host suffices"


def test_env_key_follows_what_is_installed(tmp_path: Path) -> None:
    a = resolve(_model(tmp_path / "a", {"requirements.txt": "npuport-nothing==1.0\n"}), "cpu", None)
    b = resolve(_model(tmp_path / "b", {"requirements.txt": "npuport-nothing==1.0\n"}), "cpu", None)
    c = resolve(_model(tmp_path / "c", {"requirements.txt": "npuport-nothing==1.1\n"}), "cpu", None)
    assert a.env_key == b.env_key != c.env_key and len(a.env_key) == 16


# ---------------------------------------------------------------------------------------------
# The layered environment
# ---------------------------------------------------------------------------------------------


def test_failed_install_is_a_clear_error_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pip really runs, offline: no index, an empty wheel folder.
    empty = tmp_path / "wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    res = resolve(_model(tmp_path, {"requirements.txt": "npuport-no-such-package==0.0.1\n"}), "cpu", None)
    assert res.install == ["npuport-no-such-package==0.0.1"]
    cache = tmp_path / "envs"
    with pytest.raises(EnvBuildError, match=r"could not install npuport-no-such-package==0\.0\.1 into the layered"):
        ensure_env(res, cache_root=cache)
    assert not (cache / res.env_key).exists()


def _registry_reachable(tmp: Path) -> bool:
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp),
                               "transformers==4.46.3"], capture_output=True, timeout=180)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


OLD_TF_MODEL = """import transformers

assert transformers.__version__ == "4.46.3", transformers.__version__
"""


@pytest.mark.slow
def test_a_model_pinning_an_old_transformers_runs_in_its_own_layered_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = Path(os.environ.get("NPUPORT_ENV_CACHE") or Path.home() / ".cache" / "npuport-tests" / "envs")
    monkeypatch.setenv("NPUPORT_ENV_CACHE", str(cache))
    model = write_tiny_model(tmp_path / "old_tf", twist="pass")
    (model / "modeling_tiny.py").write_text(OLD_TF_MODEL + (model / "modeling_tiny.py").read_text())
    (model / "requirements.txt").write_text("transformers==4.46.3\n")
    if HOST_TRANSFORMERS == "4.46.3":
        pytest.skip("the host itself has transformers 4.46.3; nothing to layer")

    res = resolve(model, "ascend-sim", "2.13.0")
    assert res.needs_layered_env and res.install == ["transformers==4.46.3"]
    built_before = (cache / res.env_key / MARKER).is_file()
    if not built_before:
        with tempfile.TemporaryDirectory() as probe:
            if not _registry_reachable(Path(probe)):
                pytest.skip("the package registry cannot be reached to build the layered env")
    python = ensure_env(res)
    assert python is not None and python.is_relative_to(cache)
    assert ensure_env(res) == python, "cached by the hash of its pins"

    # The whole harness runs there: `-I` (no PYTHONPATH), npuport's sandbox package from the layer.
    spec = {"model_dir": str(model), "manifest": yaml.safe_load((model / "npuport.yaml").read_text()),
            "device": "cuda", "redirect": "cuda->cpu", "target": None, "seed": 0, "warmup": 0, "repeats": 1,
            "result_path": str(tmp_path / "result.json"), "capture_path": str(tmp_path / "capture.pt")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run = subprocess.run([str(python), "-I", "-B", "-u", "-m", "sandbox.harness.worker", str(tmp_path / "spec.json")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"], (result.get("exception"), run.stderr[-2000:])
    assert len(result["outputs"]["tokens"][0]) == 4

    probe = ("import sys, torch, transformers, sandbox; "
             "print(transformers.__version__, torch.__version__, sandbox.__file__, sys.prefix)")
    out = subprocess.run([str(python), "-I", "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "4.46.3" and out[1] == HOST_TORCH, "the env's own transformers, the host's torch"
    assert Path(out[2]).resolve() == (REPO / "sandbox" / "__init__.py").resolve()
    assert Path(out[3]).resolve() == (cache / res.env_key).resolve()
    # The host keeps its own.
    host = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert host == HOST_TRANSFORMERS == md.version("transformers")


def test_an_unguarded_import_in_a_function_body_is_installed_and_a_guarded_one_is_not(tmp_path: Path) -> None:
    """``def resize(...): import tensorflow as tf`` (an image processor's resize): transformers' remote-code loader
    demands it before loading the file and the function needs it when it runs, so it is installed (the CPU
    build, lighter); imports under a guard (try, if) in a function are not."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "image_processing_m.py").write_text(
        "import numpy as np\n\n\n"
        "def resize(image):\n"
        "    import tensorflow as tf\n"
        "    return tf.image.resize(image, [2, 2])\n\n\n"
        "def optional_paths(x):\n"
        "    try:\n"
        "        import npuport_absent_guarded\n"
        "    except ImportError:\n"
        "        pass\n"
        "    if x:\n"
        "        import npuport_absent_under_if\n"
        "    from . import image_processing_m\n")
    if host_version("tensorflow") is not None or host_version("tensorflow-cpu") is not None:
        pytest.skip("the host has tensorflow: nothing to install")
    res = resolve(model, "cpu", None)
    assert "tensorflow-cpu" in res.optional and res.needs_layered_env
    assert not any("npuport_absent" in d or d == "image-processing-m" for d in res.optional), res.optional
    note = next(n for n in res.notes if "body of resize()" in n)
    assert "image_processing_m.py:5" in note and "remote-code loader" in note and "CPU build" in note
